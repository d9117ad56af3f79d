//! Kernel launches through the driver: a kernel compiled by the emulator's NVRTC, loaded with
//! `cuModuleLoadData`, launched with `cuLaunchKernel` on device memory; the launch limits, a
//! function used in another device's context, and a stray store that faults (two devices).

mod common;
mod runtime_support;

use std::ffi::{c_void, CString};

use common::{alloc, bind, setup, stream};
use cudarc::driver::sys::{CUfunction, CUresult, CUstream};
use kiln_cuda_emu::driver::*;

const ENV: &[(&str, &str)] = &[("KILN_EMU_DEVICES", "2"), ("KILN_EMU_MEMORY", "16M")];

const SOURCE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) add_one(float* data, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += 1.0f;
}
extern "C" __global__ void store_at(float* data, unsigned long long index) {
    data[index] = 7.0f;
}
"#;

fn function(module: cudarc::driver::sys::CUmodule, name: &str) -> CUfunction {
    let mut f = std::ptr::null_mut();
    let cname = CString::new(name).unwrap();
    assert_eq!(
        unsafe { cuModuleGetFunction(&mut f, module, cname.as_ptr()) },
        CUresult::CUDA_SUCCESS
    );
    f
}

fn launch(f: CUfunction, grid: u32, block: u32, s: CUstream, args: &mut [*mut c_void]) -> CUresult {
    let null = std::ptr::null_mut();
    unsafe { cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, args.as_mut_ptr(), null) }
}

#[test]
fn kernels_launch_check_limits_and_fault_stickily() {
    let _g = setup(ENV);
    bind(0);
    let image =
        runtime_support::compile("driver_launch.cu", SOURCE, &runtime_support::kiln_options())
            .unwrap();
    let image = CString::new(image).unwrap();
    let mut module = std::ptr::null_mut();
    unsafe {
        assert_eq!(
            cuModuleLoadData(&mut module, image.as_ptr().cast()),
            CUresult::CUDA_SUCCESS
        );
        let mut missing = std::ptr::null_mut();
        let name = CString::new("no_such_kernel").unwrap();
        assert_eq!(
            cuModuleGetFunction(&mut missing, module, name.as_ptr()),
            CUresult::CUDA_ERROR_NOT_FOUND
        );
    }
    let add_one = function(module, "add_one");
    let mut bound = 0;
    unsafe {
        assert_eq!(
            cuFuncGetAttribute(&mut bound, 0, add_one),
            CUresult::CUDA_SUCCESS
        )
    };
    assert_eq!(bound, 256, "the launch bounds");

    let n = 1000u32;
    let data = alloc(n as usize * 4).unwrap();
    let s = stream(1);
    let (mut ptr, mut count) = (data, n);
    let mut args = [
        (&mut ptr as *mut u64).cast(),
        (&mut count as *mut u32).cast(),
    ];
    unsafe {
        assert_eq!(
            cuMemsetD32Async(data, 0x3f80_0000, n as usize, s),
            CUresult::CUDA_SUCCESS
        )
    };
    assert_eq!(
        launch(add_one, 4, 256, s, &mut args),
        CUresult::CUDA_SUCCESS
    );
    let mut back = vec![0f32; n as usize];
    unsafe {
        assert_eq!(
            cuMemcpyDtoHAsync_v2(back.as_mut_ptr().cast(), data, n as usize * 4, s),
            CUresult::CUDA_SUCCESS
        );
    }
    assert!(back.iter().all(|&v| v == 2.0), "1.0 + 1.0 everywhere");

    assert_eq!(
        launch(add_one, 4, 512, s, &mut args),
        CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    );
    assert_eq!(
        launch(add_one, 4, 2048, s, &mut args),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        launch(add_one, 0, 256, s, &mut args),
        CUresult::CUDA_ERROR_INVALID_VALUE
    );
    let mut host = vec![0f32; 4];
    let mut host_ptr = host.as_mut_ptr() as u64;
    let mut host_args = [
        (&mut host_ptr as *mut u64).cast(),
        (&mut count as *mut u32).cast(),
    ];
    assert_eq!(
        launch(add_one, 1, 32, s, &mut host_args),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        "a host pointer"
    );

    bind(1);
    let other = stream(1);
    assert_eq!(
        launch(add_one, 4, 256, other, &mut args),
        CUresult::CUDA_ERROR_INVALID_HANDLE,
        "loaded on device 0"
    );
    bind(0);
    assert_eq!(
        launch(add_one, 4, 256, other, &mut args),
        CUresult::CUDA_ERROR_INVALID_HANDLE,
        "device 1's stream"
    );

    let store_at = function(module, "store_at");
    let mut index = n as u64 + 1024;
    let mut fault_args = [
        (&mut ptr as *mut u64).cast(),
        (&mut index as *mut u64).cast(),
    ];
    assert_eq!(
        launch(store_at, 1, 1, s, &mut fault_args),
        CUresult::CUDA_SUCCESS,
        "faults when it runs"
    );
    unsafe {
        assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(cuCtxSynchronize(), CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    assert_eq!(
        launch(add_one, 4, 256, s, &mut args),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        "sticky"
    );
    host.clear();
}
