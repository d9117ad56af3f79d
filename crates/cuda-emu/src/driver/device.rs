//! Devices: count, handles, names, UUIDs, memory and attributes (H200-like), as the driver
//! reports them after `CUDA_VISIBLE_DEVICES`.
//!
//! Invariants: a `CUdevice` is the driver ordinal (`0..count`); names and UUIDs come from the
//! physical device behind the ordinal, so a masked device keeps its identity; attribute values
//! are those of an H200 (SXM) except the compute capability (`KILN_EMU_CC`) and the memory
//! (`KILN_EMU_MEMORY`), and say "supported" only for features the emulator implements.

use std::ffi::{c_char, c_int, c_uint};

use cudarc::driver::sys::{CUdevice, CUresult, CUuuid};

use super::config::{uuid_bytes, DEVICE_NAME};
use super::context::driver;
use super::out;

/// Largest dynamic + static shared memory a block may opt in to (227 KiB).
pub(crate) const SHARED_OPTIN_BYTES: u32 = 232_448;
/// Shared memory a block gets without opting in (48 KiB).
pub(crate) const SHARED_DEFAULT_BYTES: u32 = 49_152;
/// Threads per block.
pub(crate) const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Block dimensions.
pub(crate) const MAX_BLOCK_DIM: [u32; 3] = [1024, 1024, 64];
/// Grid dimensions.
pub(crate) const MAX_GRID_DIM: [u32; 3] = [2_147_483_647, 65_535, 65_535];

/// Attribute values by `CUdevice_attribute` number; the compute capability is added at lookup.
const ATTRIBUTES: &[(u32, i32)] = &[
    (1, MAX_THREADS_PER_BLOCK as i32),
    (2, MAX_BLOCK_DIM[0] as i32),
    (3, MAX_BLOCK_DIM[1] as i32),
    (4, MAX_BLOCK_DIM[2] as i32),
    (5, MAX_GRID_DIM[0] as i32),
    (6, MAX_GRID_DIM[1] as i32),
    (7, MAX_GRID_DIM[2] as i32),
    (8, SHARED_DEFAULT_BYTES as i32),
    (9, 65_536),         // total constant memory
    (10, 32),            // warp size
    (11, 2_147_483_647), // max pitch
    (12, 65_536),        // registers per block
    (13, 1_980_000),     // clock rate, kHz
    (14, 512),           // texture alignment
    (15, 1),             // GPU overlap
    (16, 132),           // multiprocessors
    (17, 0),             // kernel exec timeout
    (18, 0),             // integrated
    (19, 1),             // can map host memory
    (20, 0),             // compute mode: default
    (30, 512),           // surface alignment
    (31, 1),             // concurrent kernels
    (32, 1),             // ECC enabled
    (35, 0),             // TCC driver
    (36, 2_619_000),     // memory clock, kHz
    (37, 6_144),         // memory bus width, bits
    (38, 62_914_560),    // L2 cache bytes
    (39, 2_048),         // threads per multiprocessor
    (40, 3),             // async engines
    (41, 1),             // unified addressing
    (50, 0),             // PCI domain
    (78, 1),             // stream priorities
    (79, 1),             // global L1 cache
    (80, 1),             // local L1 cache
    (81, 233_472),       // shared memory per multiprocessor
    (82, 65_536),        // registers per multiprocessor
    (83, 0),             // managed memory: not emulated
    (84, 0),             // multi-GPU board
    (87, 2),             // single/double perf ratio
    (90, 1),             // compute preemption
    (95, 0),             // cooperative launch: not emulated
    (97, SHARED_OPTIN_BYTES as i32),
    (99, 1),      // host register supported
    (102, 1),     // virtual memory management
    (106, 32),    // blocks per multiprocessor
    (111, 1_024), // reserved shared memory per block
    (115, 1),     // memory pools (cuMemAllocAsync / cuMemFreeAsync)
    (120, 0),     // cluster launch: not emulated
];

/// `CU_DEVICE_ATTRIBUTE_MAX` of CUDA 13.0: attributes at or past it are invalid.
const ATTRIBUTE_END: u32 = 148;

fn physical(dev: CUdevice) -> Result<usize, CUresult> {
    let d = driver()?;
    usize::try_from(dev)
        .ok()
        .and_then(|i| d.config.visible.get(i).copied())
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// The value of attribute `attrib` on every emulated device, `None` when it is invalid.
pub(crate) fn attribute(attrib: u32) -> Option<i32> {
    let cc = driver().map_or((9, 0), |d| d.config.cc);
    match attrib {
        75 => Some(cc.0),
        76 => Some(cc.1),
        a if a >= ATTRIBUTE_END || a == 0 => None,
        a => Some(
            ATTRIBUTES
                .iter()
                .find(|(n, _)| *n == a)
                .map_or(0, |(_, v)| *v),
        ),
    }
}

/// `cuDeviceGetCount`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    super::trace("cuDeviceGetCount");
    match driver() {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(d) => unsafe { out(count, d.config.visible.len() as c_int) },
        Err(code) => code,
    }
}

/// `cuDeviceGet`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    super::trace("cuDeviceGet");
    match physical(ordinal) {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(_) => unsafe { out(device, ordinal) },
        Err(code) => code,
    }
}

/// `cuDeviceGetName`: the name, truncated to `len - 1` bytes and NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    super::trace("cuDeviceGetName");
    if let Err(code) = physical(dev) {
        return code;
    }
    if name.is_null() || len <= 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let bytes = DEVICE_NAME.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: the caller's buffer holds `len` bytes; `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), name as *mut u8, n);
        *name.add(n) = 0;
    }
    CUresult::CUDA_SUCCESS
}

unsafe fn write_uuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    match physical(dev) {
        Ok(p) => {
            let bytes = uuid_bytes(p).map(|b| b as c_char);
            // SAFETY: the caller's out-pointer (checked for null).
            unsafe { out(uuid, CUuuid { bytes }) }
        }
        Err(code) => code,
    }
}

/// `cuDeviceGetUuid`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    super::trace("cuDeviceGetUuid");
    // SAFETY: forwarded out-pointer.
    unsafe { write_uuid(uuid, dev) }
}

/// `cuDeviceGetUuid_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    super::trace("cuDeviceGetUuid_v2");
    // SAFETY: forwarded out-pointer.
    unsafe { write_uuid(uuid, dev) }
}

/// `cuDeviceTotalMem_v2`: the configured capacity.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    super::trace("cuDeviceTotalMem_v2");
    match physical(dev) {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(_) => unsafe { out(bytes, crate::space::capacity() as usize) },
        Err(code) => code,
    }
}

/// `cuDeviceGetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: c_uint,
    dev: CUdevice,
) -> CUresult {
    super::trace("cuDeviceGetAttribute");
    if let Err(code) = physical(dev) {
        return code;
    }
    let value = match attrib {
        33 => Some(dev + 1), // PCI bus id: distinct per device
        34 => Some(0),       // PCI device id
        _ => attribute(attrib),
    };
    match value {
        // SAFETY: the caller's out-pointer (checked for null).
        Some(v) => unsafe { out(pi, v) },
        None => super::fail(
            "cuDeviceGetAttribute",
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("attribute {attrib} does not exist"),
        ),
    }
}

/// `cuDeviceComputeCapability` (deprecated, still bound).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    super::trace("cuDeviceComputeCapability");
    let cc = match (physical(dev), driver()) {
        (Ok(_), Ok(d)) => d.config.cc,
        (Err(code), _) | (_, Err(code)) => return code,
    };
    // SAFETY: the caller's out-pointers (checked for null).
    match unsafe { out(major, cc.0) } {
        CUresult::CUDA_SUCCESS => unsafe { out(minor, cc.1) },
        code => code,
    }
}

/// `cuDeviceCanAccessPeer`: every pair of distinct emulated devices can.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    canAccessPeer: *mut c_int,
    dev: CUdevice,
    peerDev: CUdevice,
) -> CUresult {
    super::trace("cuDeviceCanAccessPeer");
    if let Err(code) = physical(dev).and(physical(peerDev)) {
        return code;
    }
    // SAFETY: the caller's out-pointer (checked for null).
    unsafe { out(canAccessPeer, (dev != peerDev) as c_int) }
}

/// `cuCtxEnablePeerAccess`: peers share one address space already.
#[no_mangle]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(
    peerContext: cudarc::driver::sys::CUcontext,
    Flags: c_uint,
) -> CUresult {
    super::trace("cuCtxEnablePeerAccess");
    if Flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    match (
        super::context::current(),
        super::context::context_from_handle(peerContext),
    ) {
        (Ok(_), Ok(_)) => CUresult::CUDA_SUCCESS,
        (Err(code), _) | (_, Err(code)) => code,
    }
}
