//! Compiled modules and kernel launches (owner: kernel runtime work). PLACEHOLDER: the items below
//! are the contract the driver relies on; the implementation replaces the bodies.

use cudarc::driver::sys::CUresult;
use std::ffi::c_void;
use std::sync::Arc;

/// Why a launch or a kernel run failed: the driver status to return and a message that names the
/// kernel (and the argument, block or thread where known).
#[derive(Debug, Clone)]
pub struct LaunchError {
    /// The status `cuLaunchKernel` (bad arguments) or the next synchronising call (a fault while
    /// running, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`, sticky) returns.
    pub code: CUresult,
    /// Names the kernel and the problem.
    pub message: String,
}

/// Grid, block and dynamic shared memory of one launch (limits already checked by the driver).
#[derive(Debug, Clone, Copy)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes per block.
    pub shared_bytes: u32,
}

/// A loaded module (the image `nvrtc` produced), kept alive by its functions.
pub struct Module {
    _private: (),
}

impl Module {
    /// Loads an image handed to `cuModuleLoadData` (NUL-terminated text made by the emulator's
    /// NVRTC; anything else, e.g. real PTX, is `CUDA_ERROR_INVALID_IMAGE` with a message).
    pub unsafe fn load(image: *const c_void) -> Result<Arc<Module>, LaunchError> {
        let _ = image;
        Err(LaunchError {
            code: CUresult::CUDA_ERROR_NOT_SUPPORTED,
            message: "kernels are not emulated yet".into(),
        })
    }

    /// The `extern "C" __global__` function `name` (`CUDA_ERROR_NOT_FOUND` when absent).
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function, LaunchError> {
        Err(LaunchError {
            code: CUresult::CUDA_ERROR_NOT_FOUND,
            message: format!("no kernel {name}"),
        })
    }
}

/// One kernel of a module.
#[derive(Clone)]
pub struct Function {
    name: String,
}

/// A launch's arguments copied out of the caller's `void**` at launch time, by the kernel's
/// real signature (the caller's memory may be gone when the kernel runs).
pub struct CapturedArgs {
    _bytes: Vec<u8>,
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Copies the arguments `params` points at (one pointer per parameter of the real signature)
    /// and checks every pointer parameter is null or inside a live device allocation
    /// (`CUDA_ERROR_INVALID_VALUE` naming the kernel and argument otherwise).
    pub unsafe fn capture(&self, params: *mut *mut c_void) -> Result<CapturedArgs, LaunchError> {
        let _ = params;
        Err(LaunchError {
            code: CUresult::CUDA_ERROR_NOT_SUPPORTED,
            message: format!("{}: kernels are not emulated yet", self.name),
        })
    }

    /// Runs the whole grid now, on the calling thread and helpers; returns after the last block.
    pub fn run(&self, dims: LaunchDims, args: &CapturedArgs) -> Result<(), LaunchError> {
        let _ = (dims, args);
        Err(LaunchError {
            code: CUresult::CUDA_ERROR_NOT_SUPPORTED,
            message: format!("{}: kernels are not emulated yet", self.name),
        })
    }

    /// Static shared memory bytes per block the kernel declares (for the driver's limit check
    /// and `cuFuncGetAttribute`).
    pub fn static_shared_bytes(&self) -> u32 {
        0
    }
}
