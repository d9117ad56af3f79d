//! Sticky errors after a fault, and the not-supported stubs (two devices).

mod common;

use std::sync::{Arc, Barrier};

use common::{alloc, bind, setup, stream};
use cudarc::driver::sys::CUresult;
use kiln_cuda_emu::driver::*;

const ENV: &[(&str, &str)] = &[("KILN_EMU_DEVICES", "2"), ("KILN_EMU_MEMORY", "16M")];

#[test]
fn a_fault_poisons_its_context_only() {
    let _g = setup(ENV);
    bind(0);
    let s = stream(1);
    let (src, dst) = (alloc(256).unwrap(), alloc(256).unwrap());
    let gate = Arc::new(Barrier::new(2));
    let inside = gate.clone();
    enqueue(
        s,
        Box::new(move || {
            inside.wait();
            Ok(())
        }),
    )
    .unwrap();
    unsafe {
        assert_eq!(
            cuMemcpyDtoDAsync_v2(dst, src, 256, s),
            CUresult::CUDA_SUCCESS
        );
        // Freed while the queued copy still needs it: the copy faults when it runs.
        assert_eq!(cuMemFree_v2(src), CUresult::CUDA_SUCCESS);
        gate.wait();
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        let mut p = 0;
        assert_eq!(
            cuMemAlloc_v2(&mut p, 16),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
            "sticky"
        );
        assert_eq!(cuCtxSynchronize(), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(
            cuMemsetD8_v2(dst, 0, 1),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        let mut ev = std::ptr::null_mut();
        assert_eq!(
            cuEventCreate(&mut ev, 0),
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        assert_eq!(
            enqueue(std::ptr::null_mut(), Box::new(|| Ok(()))),
            Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)
        );
    }
    bind(1);
    let other = alloc(16).expect("device 1 is unaffected");
    unsafe {
        assert_eq!(cuMemFree_v2(other), CUresult::CUDA_SUCCESS);
        assert_eq!(cuCtxSynchronize(), CUresult::CUDA_SUCCESS);
    }
}

#[test]
fn stream_work_errors_are_reported_once() {
    let _g = setup(ENV);
    bind(1);
    let s = stream(0);
    enqueue(s, Box::new(|| Err(CUresult::CUDA_ERROR_INVALID_VALUE))).unwrap();
    assert_eq!(
        synchronize_stream(s),
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    );
    assert_eq!(synchronize_stream(s), Ok(()), "not sticky");
    assert_eq!(stream_device(s), Ok(1));
    assert_eq!(current_device(), Ok(1));
    unsafe { assert_eq!(cuStreamDestroy_v2(s), CUresult::CUDA_SUCCESS) };
}

#[test]
fn launches_and_stubs_refuse_cleanly() {
    let _g = setup(ENV);
    bind(1);
    unsafe {
        let r = cuLaunchKernel(
            0x1234 as _,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert_eq!(r, CUresult::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(
            kiln_cuda_emu::stubs::cuGraphCreate(),
            CUresult::CUDA_ERROR_NOT_SUPPORTED as u32
        );
        assert_eq!(
            kiln_cuda_emu::stubs::cuGraphCreate(),
            CUresult::CUDA_ERROR_NOT_SUPPORTED as u32
        );
    }
    use kiln_cuda_emu::stubs::Library;
    assert_eq!(Library::Cublas.not_supported(), 15);
    assert_eq!(Library::Nccl.not_supported(), 5);
}
