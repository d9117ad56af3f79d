//! The driver's devices, contexts, memory, copies, streams and events, called through the
//! exported C functions (two devices of 64 MiB).

mod common;

use std::ffi::{c_char, CStr};

use common::{alloc, bind, mem_info, read_faults, setup, stream};
use cudarc::driver::sys::{CUresult, CUuuid};
use kiln_cuda_emu::driver::*;
use kiln_cuda_emu::space::{check_device_range, device_of};

const ENV: &[(&str, &str)] = &[
    ("KILN_EMU_DEVICES", "3"),
    ("KILN_EMU_MEMORY", "64M"),
    ("CUDA_VISIBLE_DEVICES", "2,0"),
];
const MIB: usize = 1 << 20;

#[test]
fn devices_follow_the_visibility_mask() {
    let _g = setup(ENV);
    unsafe {
        let mut n = 0;
        assert_eq!(cuDeviceGetCount(&mut n), CUresult::CUDA_SUCCESS);
        assert_eq!(n, 2);
        let mut dev = 0;
        assert_eq!(
            cuDeviceGet(&mut dev, 2),
            CUresult::CUDA_ERROR_INVALID_DEVICE
        );
        let mut name = [0 as c_char; 64];
        assert_eq!(
            cuDeviceGetName(name.as_mut_ptr(), 64, 1),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str().unwrap(),
            "NVIDIA H200 (kiln-cuda-emu)"
        );
        let mut a = CUuuid { bytes: [0; 16] };
        let mut b = CUuuid { bytes: [0; 16] };
        assert_eq!(cuDeviceGetUuid_v2(&mut a, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuDeviceGetUuid(&mut b, 1), CUresult::CUDA_SUCCESS);
        assert_ne!(a.bytes, b.bytes);
        let mut total = 0;
        assert_eq!(cuDeviceTotalMem_v2(&mut total, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(total, 64 * MIB);
        let mut v = 0;
        assert_eq!(cuDeviceGetAttribute(&mut v, 16, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(v, 132);
        assert_eq!(cuDeviceGetAttribute(&mut v, 75, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(v, 9);
        assert_eq!(
            cuDeviceGetAttribute(&mut v, 9999, 0),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        let mut text: *const c_char = std::ptr::null();
        assert_eq!(cuGetErrorName(2, &mut text), CUresult::CUDA_SUCCESS);
        assert_eq!(
            CStr::from_ptr(text).to_str().unwrap(),
            "CUDA_ERROR_OUT_OF_MEMORY"
        );
        assert_eq!(cuGetErrorString(2, &mut text), CUresult::CUDA_SUCCESS);
        assert_eq!(CStr::from_ptr(text).to_str().unwrap(), "out of memory");
        assert_eq!(
            cuGetErrorName(123_456, &mut text),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn contexts_bind_per_thread() {
    let _g = setup(ENV);
    let ctx = bind(1);
    unsafe {
        let mut dev = -1;
        assert_eq!(cuCtxGetDevice(&mut dev), CUresult::CUDA_SUCCESS);
        assert_eq!(dev, 1);
        let mut cur = std::ptr::null_mut();
        assert_eq!(cuCtxGetCurrent(&mut cur), CUresult::CUDA_SUCCESS);
        assert_eq!(cur, ctx);
        let other = std::thread::spawn(|| {
            let mut cur = std::ptr::null_mut();
            assert_eq!(cuCtxGetCurrent(&mut cur), CUresult::CUDA_SUCCESS);
            let mut p = 0;
            (cur.is_null(), cuMemAlloc_v2(&mut p, 16))
        })
        .join()
        .unwrap();
        assert_eq!(other, (true, CUresult::CUDA_ERROR_INVALID_CONTEXT));
        let (mut flags, mut active) = (0, 0);
        assert_eq!(
            cuDevicePrimaryCtxGetState(1, &mut flags, &mut active),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(active, 1);
        let mut stack = 0;
        assert_eq!(cuCtxGetLimit(&mut stack, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(stack, 1024);
        assert_eq!(cuCtxSetLimit(0, 4096), CUresult::CUDA_SUCCESS);
        assert_eq!(cuCtxGetLimit(&mut stack, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(stack, 4096);
        assert_eq!(
            cuCtxGetLimit(&mut stack, 99),
            CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT
        );
    }
}

#[test]
fn allocations_count_against_capacity() {
    let _g = setup(ENV);
    bind(0);
    let (free0, total) = mem_info();
    assert_eq!(total, 64 * MIB);
    let a = alloc(1000).unwrap();
    assert_eq!(a % 256, 0);
    assert_eq!(mem_info().0, free0 - 1024, "sizes round up to 256 bytes");
    let b = alloc(10 * MIB).unwrap();
    assert_eq!(mem_info().0, free0 - 1024 - 10 * MIB);
    assert_eq!(alloc(free0), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!(alloc(0), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    unsafe {
        assert_eq!(cuMemFree_v2(a), CUresult::CUDA_SUCCESS);
        assert_eq!(
            cuMemFree_v2(a),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "double free"
        );
        assert_eq!(cuMemFree_v2(b + 256), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemFree_v2(b), CUresult::CUDA_SUCCESS);
    }
    assert_eq!(mem_info().0, free0);
    let all = alloc(free0).unwrap();
    assert_eq!(mem_info().0, 0);
    unsafe { assert_eq!(cuMemFree_v2(all), CUresult::CUDA_SUCCESS) };
}

#[test]
fn new_allocations_read_as_poison_not_zeros() {
    let _g = setup(ENV);
    bind(0);
    for size in [1usize, 300, 3 * MIB] {
        let p = alloc(size).unwrap();
        let mut back = vec![0u8; size];
        unsafe {
            assert_eq!(
                cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), p, size),
                CUresult::CUDA_SUCCESS
            );
        }
        assert!(
            back.iter().all(|&b| b == 0xff),
            "{size}-byte allocation: {} bytes are not 0xff",
            back.iter().filter(|&&b| b != 0xff).count()
        );
        let f = f32::from_ne_bytes([back[0]; 4]);
        assert!(size < 4 || f.is_nan(), "an unwritten f32 reads as NaN");
        unsafe { assert_eq!(cuMemFree_v2(p), CUresult::CUDA_SUCCESS) };
    }
}

#[test]
fn allocations_end_at_a_guard_page_and_die_when_freed() {
    let _g = setup(ENV);
    bind(0);
    let p = alloc(4000).unwrap();
    assert_eq!(device_of(p), Some(0));
    assert!(check_device_range(p, 4000).is_ok());
    assert!(check_device_range(p + 4000, 0).is_ok());
    let err = check_device_range(p + 3999, 2).unwrap_err();
    assert!(
        err.message.contains("runs 1 bytes past the end"),
        "{}",
        err.message
    );
    assert!(check_device_range(p - 1, 1).is_err());
    assert!(
        !read_faults(p + 4095),
        "the rounded end is still accessible"
    );
    assert!(
        read_faults(p + 4096),
        "the page after the rounded end is a guard page"
    );
    unsafe { assert_eq!(cuMemFree_v2(p), CUresult::CUDA_SUCCESS) };
    assert!(check_device_range(p, 1).is_err());
    assert!(read_faults(p), "freed memory is inaccessible");
    let q = alloc(4000).unwrap();
    assert_ne!(q, p, "a freed address is not handed out again at once");
    assert!(
        check_device_range(p, 1).is_err(),
        "so a stale pointer still fails"
    );
    unsafe { assert_eq!(cuMemFree_v2(q), CUresult::CUDA_SUCCESS) };
    let q = alloc(100).unwrap();
    unsafe {
        let (mut base, mut size) = (0, 0);
        assert_eq!(
            cuMemGetAddressRange_v2(&mut base, &mut size, q + 50),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!((base, size), (q, 100));
        let (mut kind, mut ordinal) = (0u32, -1i32);
        assert_eq!(
            cuPointerGetAttribute((&mut kind as *mut u32).cast(), 2, q),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuPointerGetAttribute((&mut ordinal as *mut i32).cast(), 9, q),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!((kind, ordinal), (2, 0));
        assert_eq!(
            cuMemGetAddressRange_v2(&mut base, &mut size, p),
            CUresult::CUDA_ERROR_NOT_FOUND
        );
        assert_eq!(cuMemFree_v2(q), CUresult::CUDA_SUCCESS);
    }
    let host = [0u8; 16];
    assert!(check_device_range(host.as_ptr() as u64, 1)
        .unwrap_err()
        .message
        .contains("not device memory"));
}

#[test]
fn copies_check_their_direction() {
    let _g = setup(ENV);
    bind(0);
    let d = alloc(64).unwrap();
    let e = alloc(64).unwrap();
    let src: Vec<u8> = (0..64).collect();
    let mut back = vec![0u8; 64];
    unsafe {
        let host = src.as_ptr() as u64;
        assert_eq!(
            cuMemcpyHtoD_v2(host, d as *const _, 64),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), host, 64),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemcpyHtoD_v2(d, src.as_ptr().cast(), 65),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemcpyDtoH_v2(e as *mut _, d, 64),
            CUresult::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemcpyHtoD_v2(d, src.as_ptr().cast(), 64),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuMemcpyDtoDAsync_v2(e, d, 64, std::ptr::null_mut()),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuMemsetD8Async(e, 7, 4, std::ptr::null_mut()),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuMemsetD32_v2(e + 2, 1, 1),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "misaligned"
        );
        assert_eq!(
            cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), e, 64),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(&back[..4], &[7, 7, 7, 7]);
        assert_eq!(&back[4..], &src[4..]);
        cuMemFree_v2(d);
        cuMemFree_v2(e);
    }
}

#[test]
fn streams_run_in_order_and_asynchronously() {
    let _g = setup(ENV);
    bind(0);
    let s = stream(1);
    let d = alloc(4).unwrap();
    let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
    let inside = gate.clone();
    kiln_cuda_emu::driver::enqueue(
        s,
        Box::new(move || {
            inside.wait();
            Ok(())
        }),
    )
    .unwrap();
    unsafe {
        assert_eq!(cuMemsetD32Async(d, 5, 1, s), CUresult::CUDA_SUCCESS);
        assert_eq!(cuStreamQuery(s), CUresult::CUDA_ERROR_NOT_READY);
        let mut ev = std::ptr::null_mut();
        assert_eq!(cuEventCreate(&mut ev, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuEventRecord(ev, s), CUresult::CUDA_SUCCESS);
        assert_eq!(cuEventQuery(ev), CUresult::CUDA_ERROR_NOT_READY);
        // A second stream waiting for the event runs its fill after the first stream's.
        let t = stream(1);
        assert_eq!(cuStreamWaitEvent(t, ev, 0), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemsetD32Async(d, 9, 1, t), CUresult::CUDA_SUCCESS);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            cuStreamQuery(t),
            CUresult::CUDA_ERROR_NOT_READY,
            "held by the event"
        );
        gate.wait();
        assert_eq!(cuStreamSynchronize(t), CUresult::CUDA_SUCCESS);
        assert_eq!(cuEventQuery(ev), CUresult::CUDA_SUCCESS);
        let mut v = 0u32;
        assert_eq!(
            cuMemcpyDtoH_v2((&mut v as *mut u32).cast(), d, 4),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(v, 9);
        let mut start = std::ptr::null_mut();
        cuEventCreate(&mut start, 0);
        cuEventRecord(start, s);
        cuEventRecord(ev, s);
        cuEventSynchronize(ev);
        let mut ms = -1.0f32;
        assert_eq!(
            cuEventElapsedTime_v2(&mut ms, start, ev),
            CUresult::CUDA_SUCCESS
        );
        assert!(ms >= 0.0);
        let mut untimed = std::ptr::null_mut();
        cuEventCreate(&mut untimed, 2);
        cuEventRecord(untimed, s);
        cuEventSynchronize(untimed);
        assert_eq!(
            cuEventElapsedTime(&mut ms, start, untimed),
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        for e in [ev, start, untimed] {
            assert_eq!(cuEventDestroy_v2(e), CUresult::CUDA_SUCCESS);
        }
        assert_eq!(cuEventQuery(ev), CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamDestroy_v2(s), CUresult::CUDA_SUCCESS);
        assert_eq!(cuStreamDestroy_v2(t), CUresult::CUDA_SUCCESS);
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_ERROR_INVALID_HANDLE);
        cuMemFree_v2(d);
    }
}

#[test]
fn pinned_reads_before_synchronising_are_stale() {
    let _g = setup(ENV);
    bind(0);
    let s = stream(1);
    let d = alloc(4).unwrap();
    unsafe {
        let mut host = std::ptr::null_mut();
        assert_eq!(cuMemHostAlloc(&mut host, 4, 0), CUresult::CUDA_SUCCESS);
        let host = host as *mut u32;
        host.write(1);
        let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
        let inside = gate.clone();
        kiln_cuda_emu::driver::enqueue(
            s,
            Box::new(move || {
                inside.wait();
                Ok(())
            }),
        )
        .unwrap();
        assert_eq!(cuMemsetD32Async(d, 42, 1, s), CUresult::CUDA_SUCCESS);
        assert_eq!(
            cuMemcpyDtoHAsync_v2(host.cast(), d, 4, s),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(host.read_volatile(), 1, "not landed before the stream ran");
        gate.wait();
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_SUCCESS);
        assert_eq!(host.read_volatile(), 42);
        assert_eq!(cuMemFreeHost(host.cast()), CUresult::CUDA_SUCCESS);
        cuStreamDestroy_v2(s);
        cuMemFree_v2(d);
    }
}

#[test]
fn async_free_happens_in_stream_order() {
    let _g = setup(ENV);
    bind(0);
    let (free0, _) = mem_info();
    let s = stream(1);
    let mut p = 0;
    unsafe {
        assert_eq!(cuMemAllocAsync(&mut p, 512, s), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, free0 - 512);
        assert_eq!(cuMemFreeAsync(p, s), CUresult::CUDA_SUCCESS);
        assert_eq!(
            cuMemFreeAsync(p, s),
            CUresult::CUDA_ERROR_INVALID_VALUE,
            "already queued"
        );
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_SUCCESS);
        assert_eq!(mem_info().0, free0);
        let mut zero = 1;
        assert_eq!(cuMemAllocAsync(&mut zero, 0, s), CUresult::CUDA_SUCCESS);
        assert_eq!(zero, 0);
        assert_eq!(cuMemsetD8Async(zero, 0, 0, s), CUresult::CUDA_SUCCESS);
        assert_eq!(cuMemFreeAsync(zero, s), CUresult::CUDA_SUCCESS);
        cuStreamDestroy_v2(s);
    }
}

/// A work item that holds its stream until the returned barrier is passed.
fn hold(s: cudarc::driver::sys::CUstream) -> std::sync::Arc<std::sync::Barrier> {
    let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
    let inside = gate.clone();
    kiln_cuda_emu::driver::enqueue(
        s,
        Box::new(move || {
            inside.wait();
            Ok(())
        }),
    )
    .unwrap();
    gate
}

#[test]
fn the_legacy_stream_synchronises_with_blocking_streams_only() {
    let _g = setup(ENV);
    bind(0);
    let (blocking, non_blocking) = (stream(0), stream(1));
    let null = std::ptr::null_mut();
    unsafe {
        // Work on a blocking stream waits for earlier null-stream work...
        let gate = hold(null);
        assert_eq!(
            cuLaunchHostFunc(blocking, Some(noop), std::ptr::null_mut()),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuLaunchHostFunc(non_blocking, Some(noop), std::ptr::null_mut()),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            cuStreamSynchronize(non_blocking),
            CUresult::CUDA_SUCCESS,
            "a non-blocking stream does not wait"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(cuStreamQuery(blocking), CUresult::CUDA_ERROR_NOT_READY);
        gate.wait();
        assert_eq!(cuStreamSynchronize(blocking), CUresult::CUDA_SUCCESS);
        // ...and null-stream work waits for earlier work on blocking streams.
        let gate = hold(blocking);
        assert_eq!(
            cuLaunchHostFunc(null, Some(noop), std::ptr::null_mut()),
            CUresult::CUDA_SUCCESS
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(cuStreamQuery(null), CUresult::CUDA_ERROR_NOT_READY);
        gate.wait();
        assert_eq!(cuCtxSynchronize(), CUresult::CUDA_SUCCESS);
        cuStreamDestroy_v2(blocking);
        cuStreamDestroy_v2(non_blocking);
    }
}

unsafe extern "C" fn noop(_: *mut std::ffi::c_void) {}
