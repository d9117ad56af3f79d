//! Shared set-up of the driver tests: one configuration per test binary (set before the first
//! `cuInit`), a lock that runs the tests of a binary one at a time (they check exact memory
//! numbers), and small wrappers over the exported C functions.
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard, Once};

use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUresult, CUstream};

/// Every variable the emulator reads: a test sets those it needs, the others are removed (the
/// suite may run under `cargo xtask emu`, which sets some).
pub const VARIABLES: &[&str] = &[
    "KILN_EMU_DEVICES",
    "KILN_EMU_MEMORY",
    "KILN_EMU_CC",
    "KILN_EMU_DELAY",
    "KILN_EMU_LOG",
    "KILN_EMU_SCHEDULE",
    "KILN_EMU_SEED",
    "KILN_EMU_THREADS",
    "KILN_EMU_OPT",
    "KILN_EMU_NCCL_TIMEOUT",
    "CUDA_VISIBLE_DEVICES",
];

/// Sets the environment once, initialises the driver and returns the test lock.
pub fn setup(env: &[(&str, &str)]) -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    static INIT: Once = Once::new();
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    INIT.call_once(|| {
        for k in VARIABLES {
            std::env::remove_var(k);
        }
        for (k, v) in env {
            std::env::set_var(k, v);
        }
        assert_eq!(
            unsafe { kiln_cuda_emu::driver::cuInit(0) },
            CUresult::CUDA_SUCCESS
        );
    });
    guard
}

/// Makes device `ordinal`'s primary context current.
pub fn bind(ordinal: i32) -> CUcontext {
    let mut ctx = std::ptr::null_mut();
    unsafe {
        assert_eq!(
            kiln_cuda_emu::driver::cuDevicePrimaryCtxRetain(&mut ctx, ordinal),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            kiln_cuda_emu::driver::cuCtxSetCurrent(ctx),
            CUresult::CUDA_SUCCESS
        );
    }
    ctx
}

/// `cuMemAlloc_v2`, as a `Result`.
pub fn alloc(bytes: usize) -> Result<CUdeviceptr, CUresult> {
    let mut p = 0;
    match unsafe { kiln_cuda_emu::driver::cuMemAlloc_v2(&mut p, bytes) } {
        CUresult::CUDA_SUCCESS => Ok(p),
        code => Err(code),
    }
}

/// `cuMemGetInfo_v2`: (free, total).
pub fn mem_info() -> (usize, usize) {
    let (mut free, mut total) = (0, 0);
    assert_eq!(
        unsafe { kiln_cuda_emu::driver::cuMemGetInfo_v2(&mut free, &mut total) },
        CUresult::CUDA_SUCCESS
    );
    (free, total)
}

/// `cuStreamCreate` with `flags`.
pub fn stream(flags: u32) -> CUstream {
    let mut s = std::ptr::null_mut();
    assert_eq!(
        unsafe { kiln_cuda_emu::driver::cuStreamCreate(&mut s, flags) },
        CUresult::CUDA_SUCCESS
    );
    s
}

/// True when reading the byte at `addr` kills a forked child with SIGSEGV (or SIGBUS).
pub fn read_faults(addr: u64) -> bool {
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            std::hint::black_box(std::ptr::read_volatile(addr as *const u8));
            libc::_exit(0);
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        libc::WIFSIGNALED(status) && matches!(libc::WTERMSIG(status), libc::SIGSEGV | libc::SIGBUS)
    }
}
