//! A bad configuration fails `cuInit` with a clear error, and every later call with it.

use cudarc::driver::sys::CUresult;
use kiln_cuda_emu::driver::*;

#[test]
fn bad_memory_size_fails_init() {
    for k in [
        "KILN_EMU_DEVICES",
        "KILN_EMU_CC",
        "KILN_EMU_DELAY",
        "KILN_EMU_LOG",
        "CUDA_VISIBLE_DEVICES",
    ] {
        std::env::remove_var(k);
    }
    std::env::set_var("KILN_EMU_MEMORY", "sixteen gigs");
    unsafe {
        let mut n = 0;
        assert_eq!(
            cuDeviceGetCount(&mut n),
            CUresult::CUDA_ERROR_NOT_INITIALIZED
        );
        assert_eq!(cuInit(0), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuInit(0), CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuDeviceGetCount(&mut n), CUresult::CUDA_ERROR_INVALID_VALUE);
        let mut v = 0;
        assert_eq!(cuDriverGetVersion(&mut v), CUresult::CUDA_SUCCESS);
        assert_eq!(v, 13000);
    }
}
