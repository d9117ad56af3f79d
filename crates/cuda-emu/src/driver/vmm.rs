//! Virtual memory management with real page mappings: `cuMemAddressReserve` reserves part of a
//! device span, `cuMemCreate` makes a memfd of physical memory (charged against capacity),
//! `cuMemMap` maps it `MAP_SHARED` into a reservation (still inaccessible), `cuMemSetAccess`
//! makes whole mappings readable and writable (then they pass `check_device_range`),
//! `cuMemUnmap` makes them inaccessible again, `cuMemRelease` frees the memory once unmapped.
//!
//! Invariants: addresses, sizes and offsets are multiples of the 2 MiB granularity; mappings lie
//! inside one reservation and never overlap; a range is published as live exactly while it is
//! mapped with read-write access; a physical allocation's memory (and its capacity charge) is
//! kept while it is mapped anywhere or its handle is unreleased, as the driver documents; access
//! is set per whole mapping (stricter than the driver, which also takes sub-ranges).
//!
//! One physical allocation may be mapped at several addresses at once (GMLake-style
//! multi-mapping, which kiln's stitched blocks use): every mapping is a `MAP_SHARED` view of the
//! same memfd, so all reach the same bytes; each has its own access and is unmapped on its own,
//! and unmapping any one of them (the first included) leaves the others live, as the driver
//! documents. A released handle cannot be mapped again (`CUDA_ERROR_INVALID_VALUE`), even while
//! its memory lives on through a mapping. Which mapping is the "original" is the caller's
//! bookkeeping, not the driver's: kiln's `CudaBackend` refuses to unmap a page that still has an
//! alias before it reaches the driver.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_ulonglong, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle, CUresult,
};

use super::context::{current_raw, driver};
use super::{fail, out};
use crate::space;

/// The allocation granularity (minimum and recommended).
pub(crate) const GRANULARITY: u64 = 2 << 20;

struct Physical {
    fd: OwnedFd,
    size: u64,
    device: usize,
    mappings: u32,
    released: bool,
}

struct Mapping {
    size: u64,
    handle: u64,
    accessible: bool,
}

struct Reservation {
    size: u64,
    device: usize,
    mappings: BTreeMap<u64, Mapping>,
}

#[derive(Default)]
struct Vmm {
    next_handle: u64,
    physical: HashMap<u64, Physical>,
    reservations: BTreeMap<u64, Reservation>,
}

static VMM: Mutex<Option<Vmm>> = Mutex::new(None);

fn state() -> MutexGuard<'static, Option<Vmm>> {
    VMM.lock().unwrap_or_else(|e| e.into_inner())
}

fn invalid(call: &str, message: impl std::fmt::Display) -> CUresult {
    fail(call, CUresult::CUDA_ERROR_INVALID_VALUE, message)
}

/// Reads the `u32` / `i32` fields of a C struct by offset (never builds an invalid enum).
unsafe fn field(base: *const u8, offset: usize) -> u32 {
    // SAFETY: the caller passes a struct at least `offset + 4` bytes long.
    unsafe { base.add(offset).cast::<u32>().read_unaligned() }
}

/// Checks a `CUmemAllocationProp`: pinned memory on a valid device; returns the device.
unsafe fn prop_device(call: &str, prop: *const CUmemAllocationProp) -> Result<usize, CUresult> {
    if prop.is_null() {
        return Err(invalid(call, "null allocation properties"));
    }
    let p = prop.cast::<u8>();
    // SAFETY: type_ @0, requestedHandleTypes @4, location.type_ @8, location.id @12.
    let (kind, handles, loc, id) = unsafe { (field(p, 0), field(p, 4), field(p, 8), field(p, 12)) };
    if kind != 1 || loc != 1 {
        return Err(invalid(
            call,
            format!("only pinned device memory is emulated (type {kind}, location type {loc})"),
        ));
    }
    if handles != 0 {
        return Err(fail(
            call,
            CUresult::CUDA_ERROR_NOT_SUPPORTED,
            "shareable handles are not emulated",
        ));
    }
    let count = driver()?.contexts.len();
    match usize::try_from(id as i32) {
        Ok(d) if d < count => Ok(d),
        _ => Err(fail(
            call,
            CUresult::CUDA_ERROR_INVALID_DEVICE,
            format!("device {}", id as i32),
        )),
    }
}

fn aligned(values: &[u64]) -> bool {
    values.iter().all(|v| v % GRANULARITY == 0)
}

/// `cuMemGetAllocationGranularity`: 2 MiB, minimum and recommended.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: u32,
) -> CUresult {
    super::trace("cuMemGetAllocationGranularity");
    // SAFETY: the caller's property struct.
    if let Err(code) = unsafe { prop_device("cuMemGetAllocationGranularity", prop) } {
        return code;
    }
    if option > 1 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's out-pointer (checked for null).
    unsafe { out(granularity, GRANULARITY as usize) }
}

/// `cuMemAddressReserve`: in the current device's span (device 0 without a context); the
/// address hint is ignored, as the driver may.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    addr: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    super::trace("cuMemAddressReserve");
    let call = "cuMemAddressReserve";
    if let Err(code) = driver() {
        return code;
    }
    let _ = addr;
    let (size, alignment) = (size as u64, alignment as u64);
    if ptr.is_null() || flags != 0 || size == 0 || !aligned(&[size]) {
        return invalid(
            call,
            format!(
                "size {size} is not a positive multiple of {GRANULARITY}, or flags {flags} != 0"
            ),
        );
    }
    if alignment != 0 && !alignment.is_power_of_two() {
        return invalid(call, format!("alignment {alignment} is not a power of two"));
    }
    let device = current_raw().map_or(0, |c| c.device as usize);
    match space::reserve(device, size, alignment.max(GRANULARITY)) {
        Ok(start) => {
            let mut st = state();
            let vmm = st.get_or_insert_with(Vmm::default);
            let mappings = BTreeMap::new();
            vmm.reservations.insert(
                start,
                Reservation {
                    size,
                    device,
                    mappings,
                },
            );
            // SAFETY: checked not null above.
            unsafe { out(ptr, start) }
        }
        Err(e) => fail(call, CUresult::CUDA_ERROR_OUT_OF_MEMORY, format!("{e:?}")),
    }
}

/// `cuMemAddressFree`: exactly one whole reservation with nothing mapped in it.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult {
    super::trace("cuMemAddressFree");
    let call = "cuMemAddressFree";
    let mut st = state();
    let vmm = st.get_or_insert_with(Vmm::default);
    match vmm.reservations.get(&ptr) {
        Some(r) if r.size == size as u64 && r.mappings.is_empty() => {
            let device = r.device;
            vmm.reservations.remove(&ptr);
            space::unreserve(device, ptr, size as u64);
            CUresult::CUDA_SUCCESS
        }
        Some(r) if r.size != size as u64 => invalid(
            call,
            format!("0x{ptr:x} reserves {} bytes, not {size}", r.size),
        ),
        Some(_) => invalid(call, format!("0x{ptr:x} still has mapped memory")),
        None => invalid(call, format!("0x{ptr:x} is not a reservation")),
    }
}

/// Raises the soft open-file limit to the hard one, once: every physical allocation is a memfd,
/// and kiln's expandable segments make one per 2 MiB page.
fn raise_file_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain syscalls on a local struct.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0
                && limit.rlim_cur < limit.rlim_max
            {
                limit.rlim_cur = limit.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    });
}

/// `cuMemCreate`: `size` bytes of physical memory on the property's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    super::trace("cuMemCreate");
    let call = "cuMemCreate";
    // SAFETY: the caller's property struct.
    let device = match unsafe { prop_device(call, prop) } {
        Ok(d) => d,
        Err(code) => return code,
    };
    let size = size as u64;
    if handle.is_null() || flags != 0 || size == 0 || !aligned(&[size]) {
        return invalid(
            call,
            format!(
                "size {size} is not a positive multiple of {GRANULARITY}, or flags {flags} != 0"
            ),
        );
    }
    raise_file_limit();
    if let Err(e) = space::charge(device, size) {
        return fail(
            call,
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!("device {device}: {e:?}"),
        );
    }
    // SAFETY: plain syscalls on a fresh descriptor.
    let fd = unsafe { libc::memfd_create(c"kiln-emu-vmm".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 || unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        let err = std::io::Error::last_os_error();
        if fd >= 0 {
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
        }
        space::uncharge(device, size);
        return fail(
            call,
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            format!("memfd of {size} bytes: {err}"),
        );
    }
    // SAFETY: a descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut st = state();
    let vmm = st.get_or_insert_with(Vmm::default);
    vmm.next_handle += 1;
    let h = vmm.next_handle;
    vmm.physical.insert(
        h,
        Physical {
            fd,
            size,
            device,
            mappings: 0,
            released: false,
        },
    );
    // SAFETY: checked not null above.
    unsafe { out(handle, h) }
}

fn drop_if_unused(vmm: &mut Vmm, handle: u64) {
    if vmm
        .physical
        .get(&handle)
        .is_some_and(|p| p.released && p.mappings == 0)
    {
        if let Some(p) = vmm.physical.remove(&handle) {
            space::uncharge(p.device, p.size);
        }
    }
}

/// `cuMemRelease`: the memory goes once no mapping uses it.
#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    super::trace("cuMemRelease");
    let mut st = state();
    let vmm = st.get_or_insert_with(Vmm::default);
    match vmm.physical.get_mut(&handle) {
        Some(p) if !p.released => {
            p.released = true;
            drop_if_unused(vmm, handle);
            CUresult::CUDA_SUCCESS
        }
        _ => invalid(
            "cuMemRelease",
            format!("handle {handle} is not a live allocation"),
        ),
    }
}

/// The reservation holding `[ptr, ptr + size)`.
fn reservation_of(vmm: &mut Vmm, ptr: u64, size: u64) -> Option<&mut Reservation> {
    let (&start, r) = vmm.reservations.range_mut(..=ptr).next_back()?;
    (ptr + size <= start + r.size).then_some(r)
}

/// `cuMemMap`: maps `handle` (offset 0) at `ptr`, inaccessible until `cuMemSetAccess`.
#[no_mangle]
pub unsafe extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    super::trace("cuMemMap");
    let call = "cuMemMap";
    let size = size as u64;
    if flags != 0 || offset != 0 || size == 0 || !aligned(&[ptr, size]) {
        return invalid(call, format!("0x{ptr:x} + {size} (offset {offset}, flags {flags}): must be granularity-aligned, offset and flags 0"));
    }
    let mut st = state();
    let vmm = st.get_or_insert_with(Vmm::default);
    let (fd, phys_size) = match vmm.physical.get(&handle) {
        Some(p) if !p.released => (p.fd.as_raw_fd(), p.size),
        _ => return invalid(call, format!("handle {handle} is not a live allocation")),
    };
    if size > phys_size {
        return invalid(
            call,
            format!("{size} bytes mapped from a {phys_size}-byte allocation"),
        );
    }
    let Some(res) = reservation_of(vmm, ptr, size) else {
        return invalid(
            call,
            format!("0x{ptr:x} + {size} is not inside one reservation"),
        );
    };
    let end = ptr + size;
    let overlaps = res
        .mappings
        .range(..end)
        .next_back()
        .is_some_and(|(&s, m)| s + m.size > ptr);
    if overlaps {
        return invalid(call, format!("0x{ptr:x} + {size} overlaps a mapping"));
    }
    // SAFETY: replaces inaccessible pages of our reservation with the memfd, shared.
    let got = unsafe {
        libc::mmap(
            ptr as *mut c_void,
            size as usize,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return fail(
            call,
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            std::io::Error::last_os_error(),
        );
    }
    res.mappings.insert(
        ptr,
        Mapping {
            size,
            handle,
            accessible: false,
        },
    );
    if let Some(p) = vmm.physical.get_mut(&handle) {
        p.mappings += 1;
    }
    CUresult::CUDA_SUCCESS
}

/// The mappings exactly tiling `[ptr, ptr + size)`, by start, or `None`.
fn tiling(res: &Reservation, ptr: u64, size: u64) -> Option<Vec<u64>> {
    let mut at = ptr;
    let mut starts = Vec::new();
    while at < ptr + size {
        let m = res.mappings.get(&at)?;
        starts.push(at);
        at += m.size;
    }
    (at == ptr + size).then_some(starts)
}

/// `cuMemUnmap`: whole mappings only; the range becomes inaccessible.
#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    super::trace("cuMemUnmap");
    let call = "cuMemUnmap";
    let size = size as u64;
    let mut st = state();
    let vmm = st.get_or_insert_with(Vmm::default);
    let Some(res) = reservation_of(vmm, ptr, size) else {
        return invalid(
            call,
            format!("0x{ptr:x} + {size} is not inside a reservation"),
        );
    };
    let Some(starts) = tiling(res, ptr, size).filter(|_| size > 0) else {
        return invalid(
            call,
            format!("0x{ptr:x} + {size} is not a whole number of mappings"),
        );
    };
    space::withdraw_mapping(ptr, size);
    if let Err(e) = space::discard(ptr, size) {
        return fail(call, CUresult::CUDA_ERROR_UNKNOWN, e);
    }
    let handles: Vec<u64> = starts
        .iter()
        .filter_map(|s| res.mappings.remove(s))
        .map(|m| m.handle)
        .collect();
    for h in handles {
        if let Some(p) = vmm.physical.get_mut(&h) {
            p.mappings -= 1;
        }
        drop_if_unused(vmm, h);
    }
    CUresult::CUDA_SUCCESS
}

/// `cuMemSetAccess`: read-write, read-only or no access for whole mappings.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    super::trace("cuMemSetAccess");
    let call = "cuMemSetAccess";
    let size = size as u64;
    if desc.is_null() || count == 0 {
        return invalid(call, "no access descriptors");
    }
    let devices = match driver() {
        Ok(d) => d.contexts.len() as u32,
        Err(code) => return code,
    };
    let mut prot = libc::PROT_NONE;
    for i in 0..count {
        // SAFETY: the caller passes `count` descriptors: location.type_ @0, id @4, flags @8.
        let (loc, id, flags) = unsafe {
            let d = desc.add(i).cast::<u8>();
            (field(d, 0), field(d, 4), field(d, 8))
        };
        if loc != 1 || id >= devices {
            return fail(
                call,
                CUresult::CUDA_ERROR_INVALID_DEVICE,
                format!("location type {loc}, id {}", id as i32),
            );
        }
        prot = match flags {
            0 => prot,
            1 => prot | libc::PROT_READ,
            3 => libc::PROT_READ | libc::PROT_WRITE,
            f => return invalid(call, format!("access flags {f}")),
        };
    }
    let mut st = state();
    let vmm = st.get_or_insert_with(Vmm::default);
    let physical_devices: HashMap<u64, usize> =
        vmm.physical.iter().map(|(h, p)| (*h, p.device)).collect();
    let Some(res) = reservation_of(vmm, ptr, size) else {
        return invalid(
            call,
            format!("0x{ptr:x} + {size} is not inside a reservation"),
        );
    };
    let Some(starts) = tiling(res, ptr, size).filter(|_| size > 0) else {
        return invalid(
            call,
            format!("0x{ptr:x} + {size} is not a whole number of mapped mappings"),
        );
    };
    space::withdraw_mapping(ptr, size);
    // SAFETY: mapped pages of our reservation.
    if unsafe { libc::mprotect(ptr as *mut c_void, size as usize, prot) } != 0 {
        return fail(
            call,
            CUresult::CUDA_ERROR_UNKNOWN,
            std::io::Error::last_os_error(),
        );
    }
    let read_write = prot == libc::PROT_READ | libc::PROT_WRITE;
    for s in starts {
        if let Some(m) = res.mappings.get_mut(&s) {
            m.accessible = read_write;
            if read_write {
                let device = physical_devices
                    .get(&m.handle)
                    .copied()
                    .unwrap_or(res.device);
                space::publish_mapping(s, m.size, device as i32);
            }
        }
    }
    CUresult::CUDA_SUCCESS
}
