//! Virtual memory management with real page mappings (one device of 64 MiB).

mod common;

use common::{bind, mem_info, read_faults, setup};
use cudarc::driver::sys::{CUmemAccessDesc, CUmemAllocationProp, CUresult};
use kiln_cuda_emu::driver::*;
use kiln_cuda_emu::space::check_device_range;

const ENV: &[(&str, &str)] = &[("KILN_EMU_DEVICES", "1"), ("KILN_EMU_MEMORY", "64M")];
const PAGE: usize = 2 << 20;

fn prop() -> CUmemAllocationProp {
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = cudarc::driver::sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = cudarc::driver::sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop
}

fn access(flags: cudarc::driver::sys::CUmemAccess_flags) -> CUmemAccessDesc {
    CUmemAccessDesc {
        location: prop().location,
        flags,
    }
}

fn create() -> Result<u64, CUresult> {
    let mut h = 0;
    match unsafe { cuMemCreate(&mut h, PAGE, &prop(), 0) } {
        CUresult::CUDA_SUCCESS => Ok(h),
        code => Err(code),
    }
}

#[test]
fn pages_map_unmap_and_release_like_the_driver() {
    let _g = setup(ENV);
    bind(0);
    use cudarc::driver::sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as RW;
    unsafe {
        let mut gran = 0;
        assert_eq!(
            cuMemGetAllocationGranularity(&mut gran, &prop(), 1),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(gran, PAGE);
        let mut r = 0;
        assert_eq!(
            cuMemAddressReserve(&mut r, PAGE + 4096, 0, 0, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemAddressReserve(&mut r, 4 * PAGE, 0, 0, 0),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(r as usize % PAGE, 0);
        let r = r;
        let (free0, _) = mem_info();
        let (a, b) = (create().unwrap(), create().unwrap());
        assert_eq!(
            mem_info().0,
            free0 - 2 * PAGE,
            "physical memory counts against capacity"
        );
        assert_eq!(
            cuMemCreate(&mut 0, PAGE + 1, &prop(), 0),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemMap(r, PAGE, 0, a, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(
            cuMemMap(r, PAGE, 0, b, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "mapped twice"
        );
        assert_eq!(
            cuMemMap(r + 4096, PAGE, 0, b, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "unaligned"
        );
        assert_eq!(
            cuMemMap(r + 4 * PAGE as u64, PAGE, 0, b, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "outside"
        );
        assert_eq!(
            cuMemMap(r + PAGE as u64, PAGE, 0, b, 0),
            CUresult::CUDA_SUCCESS
        );
        assert!(
            check_device_range(r, 1).is_err(),
            "mapped but no access yet"
        );
        assert!(read_faults(r));
        let rw = access(RW);
        assert_eq!(
            cuMemSetAccess(r, 3 * PAGE, &rw, 1),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "third page unmapped"
        );
        assert_eq!(cuMemSetAccess(r, 2 * PAGE, &rw, 1), CUresult::CUDA_SUCCESS);
        assert!(
            check_device_range(r, 2 * PAGE as u64).is_ok(),
            "adjacent mappings form one range"
        );
        assert!(check_device_range(r + 2 * PAGE as u64 - 1, 2).is_err());
        assert!(!read_faults(r + 2 * PAGE as u64 - 1));
        assert!(read_faults(r + 2 * PAGE as u64));
        assert_eq!(
            cuMemsetD32_v2(r + PAGE as u64 - 4, 0x0102_0304, 2),
            CUresult::CUDA_SUCCESS
        );
        let mut back = [0u32; 2];
        assert_eq!(
            cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), r + PAGE as u64 - 4, 8),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(back, [0x0102_0304; 2]);

        assert_eq!(
            cuMemUnmap(r, PAGE / 2),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "part of a mapping"
        );
        assert_eq!(
            cuMemAddressFree(r, 4 * PAGE),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "still mapped"
        );
        assert_eq!(cuMemUnmap(r + PAGE as u64, PAGE), CUresult::CUDA_SUCCESS);
        assert!(check_device_range(r + PAGE as u64, 1).is_err());
        assert!(read_faults(r + PAGE as u64));
        assert!(check_device_range(r, PAGE as u64).is_ok());
        assert_eq!(cuMemRelease(b), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, free0 - PAGE);
        assert_eq!(
            cuMemRelease(b),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "released twice"
        );

        // The same physical memory mapped twice shows the same bytes (MAP_SHARED).
        assert_eq!(
            cuMemMap(r + 2 * PAGE as u64, PAGE, 0, a, 0),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuMemSetAccess(r + 2 * PAGE as u64, PAGE, &rw, 1),
            CUresult::CUDA_SUCCESS
        );
        let mut v = 0u32;
        assert_eq!(
            cuMemcpyDtoH_v2((&mut v as *mut u32).cast(), r + 3 * PAGE as u64 - 4, 4),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(v, 0x0102_0304);

        // Released while mapped: the memory stays until its last mapping goes.
        assert_eq!(cuMemRelease(a), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, free0 - PAGE);
        assert_eq!(cuMemUnmap(r, PAGE), CUresult::CUDA_SUCCESS);
        assert_eq!(
            cuMemUnmap(r + 2 * PAGE as u64, PAGE),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(mem_info().0, free0);
        assert_eq!(
            cuMemAddressFree(r, 2 * PAGE),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "wrong size"
        );
        assert_eq!(cuMemAddressFree(r, 4 * PAGE), CUresult::CUDA_SUCCESS);
        assert_eq!(
            cuMemAddressFree(r, 4 * PAGE),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn physical_memory_is_bounded_by_capacity() {
    let _g = setup(ENV);
    bind(0);
    let (free0, _) = mem_info();
    let mut handles = Vec::new();
    for _ in 0..free0 / PAGE {
        handles.push(create().unwrap());
    }
    assert_eq!(create(), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    for h in handles {
        assert_eq!(unsafe { cuMemRelease(h) }, CUresult::CUDA_SUCCESS);
    }
    assert_eq!(mem_info().0, free0);
}

/// `cuMemcpyDtoH_v2` of one `u32`, as a `Result`.
fn read_u32(at: u64) -> Result<u32, CUresult> {
    let mut v = 0u32;
    match unsafe { cuMemcpyDtoH_v2((&mut v as *mut u32).cast(), at, 4) } {
        CUresult::CUDA_SUCCESS => Ok(v),
        code => Err(code),
    }
}

/// GMLake-style multi-mapping, as kiln's stitched blocks use it: one physical allocation mapped
/// at an address of a second reservation is one memory reached from two addresses. Either
/// mapping goes on its own (the driver allows unmapping the first while the second lives; the
/// memory and its capacity charge stay until the last mapping is gone), access is per mapping,
/// and a released handle cannot be mapped again.
#[test]
fn one_allocation_mapped_at_two_addresses_is_one_memory() {
    let _g = setup(ENV);
    bind(0);
    use cudarc::driver::sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as RW;
    let rw = access(RW);
    let p = PAGE as u64;
    unsafe {
        let (mut r, mut q) = (0, 0);
        assert_eq!(
            cuMemAddressReserve(&mut r, 2 * PAGE, 0, 0, 0),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuMemAddressReserve(&mut q, 2 * PAGE, 0, 0, 0),
            CUresult::CUDA_SUCCESS
        );
        let (free0, _) = mem_info();
        let (a, b) = (create().unwrap(), create().unwrap());
        // Original pages a, b at r; aliases at q in the other order (a stitched block's pages
        // need not be in their original order).
        assert_eq!(cuMemMap(r, PAGE, 0, a, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemMap(r + p, PAGE, 0, b, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemSetAccess(r, 2 * PAGE, &rw, 1), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemMap(q, PAGE, 0, b, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemMap(q + p, PAGE, 0, a, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(
            cuMemMap(q, PAGE, 0, a, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "an alias over a mapping"
        );
        assert_eq!(mem_info().0, free0 - 2 * PAGE, "aliases cost no memory");
        // The alias is mapped but not accessible until its own cuMemSetAccess.
        assert!(check_device_range(q, 1).is_err());
        assert!(read_faults(q));
        assert_eq!(read_u32(q), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(cuMemSetAccess(q, 2 * PAGE, &rw, 1), CUresult::CUDA_SUCCESS);
        assert!(
            check_device_range(q, 2 * p).is_ok(),
            "one range over two handles"
        );

        // Bytes written through the original are read through the alias, and back.
        assert_eq!(
            cuMemsetD32_v2(r + 8, 0xA1A1_0001, 1),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuMemsetD32_v2(r + p + 16, 0xB2B2_0002, 1),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(read_u32(q + p + 8), Ok(0xA1A1_0001));
        assert_eq!(read_u32(q + 16), Ok(0xB2B2_0002));
        let word = 0xC3C3_0003u32;
        assert_eq!(
            cuMemcpyHtoD_v2(q + 2 * p - 4, (&word as *const u32).cast(), 4),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(read_u32(r + p - 4), Ok(word));
        // A device-to-device copy into the alias lands in the original page.
        assert_eq!(cuMemcpyDtoD_v2(q + 32, r + 8, 4), CUresult::CUDA_SUCCESS);
        assert_eq!(read_u32(r + p + 32), Ok(0xA1A1_0001));

        // Unmapping the original leaves the alias reaching the same bytes.
        assert_eq!(cuMemUnmap(r, 2 * PAGE), CUresult::CUDA_SUCCESS);
        assert!(read_faults(r) && check_device_range(r, 1).is_err());
        assert_eq!(read_u32(q + p + 8), Ok(0xA1A1_0001));
        assert_eq!(read_u32(q + 16), Ok(0xB2B2_0002));
        assert_eq!(mem_info().0, free0 - 2 * PAGE);
        // Released while the alias maps it: the memory stays, the handle is dead.
        assert_eq!(cuMemRelease(a), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, free0 - 2 * PAGE);
        assert_eq!(read_u32(q + 2 * p - 4), Ok(word));
        assert_eq!(
            cuMemMap(r, PAGE, 0, a, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "a released handle mapped again"
        );
        assert_eq!(
            cuMemMap(r, PAGE, 0, 0xdead_beef, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "no such handle"
        );
        // Mapped again at its first address from a live handle: the bytes are still there.
        assert_eq!(cuMemMap(r + p, PAGE, 0, b, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemSetAccess(r + p, PAGE, &rw, 1), CUresult::CUDA_SUCCESS);
        assert_eq!(read_u32(r + p + 16), Ok(0xB2B2_0002));

        // The last mapping of `a` goes with the alias: its memory goes with it.
        assert_eq!(cuMemUnmap(q + p, PAGE), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, free0 - PAGE);
        assert!(read_faults(q + p));
        assert_eq!(read_u32(q + 16), Ok(0xB2B2_0002));
        assert_eq!(cuMemUnmap(q, PAGE), CUresult::CUDA_SUCCESS);
        assert_eq!(read_u32(r + p + 16), Ok(0xB2B2_0002));
        assert_eq!(cuMemUnmap(r + p, PAGE), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemRelease(b), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, free0);
        assert_eq!(cuMemAddressFree(r, 2 * PAGE), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemAddressFree(q, 2 * PAGE), CUresult::CUDA_SUCCESS);
    }
}
