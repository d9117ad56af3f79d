//! Modules, functions and kernel launches (`cuModule*`, `cuFunc*`, `cuLaunchKernel`), over the
//! kernel runtime's contract ([`crate::kernel`]).
//!
//! Invariants:
//! - A launch is checked against the H200's limits before anything is queued, with the driver's
//!   codes: a zero or oversized grid or block dimension, more than 1024 threads per block, or
//!   more shared memory than the function may use is `CUDA_ERROR_INVALID_VALUE`; more threads
//!   than the kernel's launch bounds allow is `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`; a stream of
//!   another context, or a function loaded in another context, is `CUDA_ERROR_INVALID_HANDLE`.
//!   Every refusal is logged with the kernel's name.
//! - Arguments are copied out of the caller's `void**` during the call (`Function::capture`), so
//!   the caller may reuse them at once; the grid runs later on the stream's worker, and a fault
//!   there becomes the context's sticky error, logged with the kernel's name.
//! - A function handle stays valid until its module is unloaded.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUfunction, CUmodule, CUresult, CUstream};

use super::context::current;
use super::device::{
    MAX_BLOCK_DIM, MAX_GRID_DIM, MAX_THREADS_PER_BLOCK, SHARED_DEFAULT_BYTES, SHARED_OPTIN_BYTES,
};
use super::events::resolve_stream;
use super::stream::Item;
use super::{fail, log, out};
use crate::kernel::{Function, LaunchDims, Module};

struct Entry {
    function: Function,
    module: usize,
    /// The device whose context loaded the module.
    device: i32,
    max_dynamic_shared: AtomicU32,
}

static NEXT: AtomicUsize = AtomicUsize::new(0x10_0000);
/// A loaded module and the device of the context that loaded it.
type Loaded = (Arc<Module>, i32);

static MODULES: Mutex<Option<HashMap<usize, Loaded>>> = Mutex::new(None);
static FUNCTIONS: Mutex<Option<HashMap<usize, Arc<Entry>>>> = Mutex::new(None);

fn function_entry(handle: CUfunction) -> Result<Arc<Entry>, CUresult> {
    let functions = FUNCTIONS.lock().unwrap_or_else(|e| e.into_inner());
    functions
        .as_ref()
        .and_then(|m| m.get(&(handle as usize)).cloned())
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// The most threads per block the kernel's launch bounds allow.
fn kernel_thread_limit(function: &Function) -> u32 {
    function.max_threads_per_block()
}

unsafe fn load(call: &str, module: *mut CUmodule, image: *const c_void) -> CUresult {
    let device = match current() {
        Ok(ctx) => ctx.device,
        Err(code) => return code,
    };
    if module.is_null() || image.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated image (the contract of `cuModuleLoadData`).
    match unsafe { Module::load(image) } {
        Ok(m) => {
            let handle = NEXT.fetch_add(0x10, Ordering::Relaxed);
            MODULES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(HashMap::new)
                .insert(handle, (m, device));
            // SAFETY: checked not null above.
            unsafe { out(module, handle as CUmodule) }
        }
        Err(e) => fail(call, e.code, e.message),
    }
}

/// `cuModuleLoadData`: an image made by the emulator's NVRTC.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    super::trace("cuModuleLoadData");
    // SAFETY: forwarded.
    unsafe { load("cuModuleLoadData", module, image) }
}

/// `cuModuleLoad`: reads the file, then loads it like `cuModuleLoadData`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) -> CUresult {
    super::trace("cuModuleLoad");
    if fname.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller passes a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) }
        .to_string_lossy()
        .into_owned();
    match std::fs::read(&path) {
        Ok(mut bytes) => {
            bytes.push(0);
            // SAFETY: `bytes` is NUL-terminated and outlives the call.
            unsafe { load("cuModuleLoad", module, bytes.as_ptr().cast()) }
        }
        Err(e) => fail(
            "cuModuleLoad",
            CUresult::CUDA_ERROR_FILE_NOT_FOUND,
            format!("{path}: {e}"),
        ),
    }
}

/// `cuModuleUnload`: its functions become invalid (kernels already queued still run).
#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    super::trace("cuModuleUnload");
    let h = hmod as usize;
    let removed = MODULES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|m| m.remove(&h));
    if removed.is_none() {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    }
    if let Some(functions) = FUNCTIONS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        functions.retain(|_, e| e.module != h);
    }
    CUresult::CUDA_SUCCESS
}

/// `cuModuleGetFunction`.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    super::trace("cuModuleGetFunction");
    if let Err(code) = current() {
        return code;
    }
    if hfunc.is_null() || name.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let module = MODULES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&(hmod as usize)).cloned());
    let Some((module, device)) = module else {
        return CUresult::CUDA_ERROR_INVALID_HANDLE;
    };
    // SAFETY: the caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    match module.function(&name) {
        Ok(function) => {
            let static_bytes = function.static_shared_bytes();
            let entry = Arc::new(Entry {
                function,
                module: hmod as usize,
                device,
                max_dynamic_shared: AtomicU32::new(
                    SHARED_DEFAULT_BYTES.saturating_sub(static_bytes),
                ),
            });
            let handle = NEXT.fetch_add(0x10, Ordering::Relaxed);
            FUNCTIONS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(HashMap::new)
                .insert(handle, entry);
            // SAFETY: checked not null above.
            unsafe { out(hfunc, handle as CUfunction) }
        }
        // A missing kernel is a plain status (kiln probes for optional kernels), not logged.
        Err(e) if e.code == CUresult::CUDA_ERROR_NOT_FOUND => e.code,
        Err(e) => fail("cuModuleGetFunction", e.code, e.message),
    }
}

/// `cuFuncGetAttribute`.
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: c_uint,
    hfunc: CUfunction,
) -> CUresult {
    super::trace("cuFuncGetAttribute");
    let entry = match function_entry(hfunc) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let cc = super::context::driver().map_or((9, 0), |d| d.config.cc);
    let f = &entry.function;
    let value = match attrib {
        0 => kernel_thread_limit(f) as c_int,
        1 => f.static_shared_bytes() as c_int,
        2 | 3 => 0,
        4 => 32,
        5 | 6 => cc.0 * 10 + cc.1,
        7 => 0,
        8 => entry.max_dynamic_shared.load(Ordering::SeqCst) as c_int,
        9 => -1,
        10..=15 => 0,
        _ => {
            return fail(
                "cuFuncGetAttribute",
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("attribute {attrib}"),
            )
        }
    };
    // SAFETY: the caller's out-pointer (checked for null).
    unsafe { out(pi, value) }
}

/// `cuFuncSetAttribute`: `MAX_DYNAMIC_SHARED_SIZE_BYTES` (up to the 227 KiB opt-in, less the
/// static shared memory) and the carveout; others are not settable.
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(
    hfunc: CUfunction,
    attrib: c_uint,
    value: c_int,
) -> CUresult {
    super::trace("cuFuncSetAttribute");
    let entry = match function_entry(hfunc) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let name = entry.function.name().to_string();
    match attrib {
        8 => {
            let room =
                SHARED_OPTIN_BYTES - entry.function.static_shared_bytes().min(SHARED_OPTIN_BYTES);
            match u32::try_from(value) {
                Ok(v) if v <= room => {
                    entry.max_dynamic_shared.store(v, Ordering::SeqCst);
                    CUresult::CUDA_SUCCESS
                }
                _ => fail(
                    "cuFuncSetAttribute",
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!(
                        "kernel {name}: {value} bytes of dynamic shared memory, at most {room}"
                    ),
                ),
            }
        }
        9 if (-1..=100).contains(&value) => CUresult::CUDA_SUCCESS,
        _ => fail(
            "cuFuncSetAttribute",
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("kernel {name}: attribute {attrib} = {value} cannot be set"),
        ),
    }
}

/// `cuFuncSetCacheConfig`: accepted (the emulator has no L1/shared split).
#[no_mangle]
pub unsafe extern "C" fn cuFuncSetCacheConfig(hfunc: CUfunction, config: c_uint) -> CUresult {
    super::trace("cuFuncSetCacheConfig");
    match function_entry(hfunc) {
        Ok(_) if config <= 3 => CUresult::CUDA_SUCCESS,
        Ok(_) => CUresult::CUDA_ERROR_INVALID_VALUE,
        Err(code) => code,
    }
}

/// What a function allows a launch: threads per block and shared memory bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FunctionLimits {
    /// Threads per block its launch bounds allow.
    pub(crate) threads: u32,
    /// Static shared memory it declares.
    pub(crate) static_shared: u32,
    /// Dynamic shared memory it may use (`MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    pub(crate) max_dynamic_shared: u32,
}

/// Checks a launch configuration against the device and the function; the error names the
/// kernel and says what is over which limit.
pub(crate) fn check_dims(
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    limits: FunctionLimits,
) -> Result<(), (CUresult, String)> {
    let invalid = |what: String| {
        Err((
            CUresult::CUDA_ERROR_INVALID_VALUE,
            format!("kernel {name}: {what}"),
        ))
    };
    if grid.contains(&0) || block.contains(&0) {
        return invalid(format!("empty launch: grid {grid:?}, block {block:?}"));
    }
    for axis in 0..3 {
        if block[axis] > MAX_BLOCK_DIM[axis] {
            return invalid(format!(
                "block {block:?} exceeds the device's {MAX_BLOCK_DIM:?}"
            ));
        }
        if grid[axis] > MAX_GRID_DIM[axis] {
            return invalid(format!(
                "grid {grid:?} exceeds the device's {MAX_GRID_DIM:?}"
            ));
        }
    }
    let threads = block.iter().map(|&d| d as u64).product::<u64>();
    if threads > MAX_THREADS_PER_BLOCK as u64 {
        return invalid(format!(
            "{threads} threads per block, the device allows {MAX_THREADS_PER_BLOCK}"
        ));
    }
    if threads > limits.threads as u64 {
        return Err((
            CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            format!(
                "kernel {name}: {threads} threads per block, its launch bounds allow {}",
                limits.threads
            ),
        ));
    }
    let (static_bytes, max_dynamic) = (limits.static_shared, limits.max_dynamic_shared);
    if shared > max_dynamic || static_bytes as u64 + shared as u64 > SHARED_OPTIN_BYTES as u64 {
        return invalid(format!(
            "{shared} bytes of dynamic shared memory (+ {static_bytes} static); the function may \
             use {max_dynamic} dynamic (raise it with cuFuncSetAttribute, up to {SHARED_OPTIN_BYTES} \
             in all)"
        ));
    }
    Ok(())
}

/// `cuLaunchKernel`: checks the launch, captures the arguments, queues the grid.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gridDimX: c_uint,
    gridDimY: c_uint,
    gridDimZ: c_uint,
    blockDimX: c_uint,
    blockDimY: c_uint,
    blockDimZ: c_uint,
    sharedMemBytes: c_uint,
    hStream: CUstream,
    kernelParams: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    super::trace("cuLaunchKernel");
    let ctx = match current() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let entry = match function_entry(f) {
        Ok(e) => e,
        Err(code) => {
            return fail(
                "cuLaunchKernel",
                code,
                format!("{f:?} is not a loaded function"),
            )
        }
    };
    let name = entry.function.name().to_string();
    let stream = match resolve_stream(hStream) {
        Ok(s) => s,
        Err(code) => {
            return fail(
                "cuLaunchKernel",
                code,
                format!("kernel {name}: stream {hStream:?} is not valid"),
            )
        }
    };
    if !std::ptr::eq(stream.ctx, ctx) {
        return fail(
            "cuLaunchKernel",
            CUresult::CUDA_ERROR_INVALID_HANDLE,
            format!(
                "kernel {name}: the stream belongs to device {}, the current context to device {}",
                stream.ctx.device, ctx.device
            ),
        );
    }
    if entry.device != ctx.device {
        return fail(
            "cuLaunchKernel",
            CUresult::CUDA_ERROR_INVALID_HANDLE,
            format!(
                "kernel {name} was loaded in device {}'s context, launched in device {}'s",
                entry.device, ctx.device
            ),
        );
    }
    if !extra.is_null() {
        return fail(
            "cuLaunchKernel",
            CUresult::CUDA_ERROR_NOT_SUPPORTED,
            format!("kernel {name}: `extra` launch parameters are not emulated"),
        );
    }
    let grid = [gridDimX, gridDimY, gridDimZ];
    let block = [blockDimX, blockDimY, blockDimZ];
    let limits = FunctionLimits {
        threads: kernel_thread_limit(&entry.function),
        static_shared: entry.function.static_shared_bytes(),
        max_dynamic_shared: entry.max_dynamic_shared.load(Ordering::SeqCst),
    };
    if let Err((code, message)) = check_dims(&name, grid, block, sharedMemBytes, limits) {
        return fail("cuLaunchKernel", code, message);
    }
    // SAFETY: the caller passes one pointer per kernel parameter (the contract of the call).
    let args = match unsafe { entry.function.capture(kernelParams) } {
        Ok(a) => a,
        Err(e) => return fail("cuLaunchKernel", e.code, e.message),
    };
    let dims = LaunchDims {
        grid,
        block,
        shared_bytes: sharedMemBytes,
    };
    let function = entry.function.clone();
    stream.submit(Item::Work(Box::new(move || {
        function.run(dims, &args).map_err(|e| {
            log(&format!("{} ({:?})", e.message, e.code));
            e.code
        })
    })));
    CUresult::CUDA_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: FunctionLimits = FunctionLimits {
        threads: 256,
        static_shared: 1024,
        max_dynamic_shared: SHARED_DEFAULT_BYTES - 1024,
    };

    fn code(grid: [u32; 3], block: [u32; 3], shared: u32) -> Option<CUresult> {
        check_dims("k", grid, block, shared, LIMITS)
            .err()
            .map(|(c, m)| {
                assert!(m.starts_with("kernel k: "), "{m}");
                c
            })
    }

    #[test]
    fn launches_are_checked_against_the_h200() {
        use CUresult::{
            CUDA_ERROR_INVALID_VALUE as INVALID, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES as OOR,
        };
        assert_eq!(code([1, 1, 1], [256, 1, 1], 0), None);
        assert_eq!(code([2_147_483_647, 65_535, 65_535], [16, 16, 1], 0), None);
        assert_eq!(code([0, 1, 1], [32, 1, 1], 0), Some(INVALID));
        assert_eq!(code([1, 65_536, 1], [32, 1, 1], 0), Some(INVALID));
        assert_eq!(code([1, 1, 1], [1, 1, 65], 0), Some(INVALID));
        assert_eq!(code([1, 1, 1], [2048, 1, 1], 0), Some(INVALID));
        assert_eq!(
            code([1, 1, 1], [32, 32, 2], 0),
            Some(INVALID),
            "2048 threads"
        );
        assert_eq!(
            code([1, 1, 1], [512, 1, 1], 0),
            Some(OOR),
            "over the launch bounds"
        );
        assert_eq!(
            code([1, 1, 1], [32, 1, 1], SHARED_DEFAULT_BYTES - 1024),
            None
        );
        assert_eq!(
            code([1, 1, 1], [32, 1, 1], SHARED_DEFAULT_BYTES - 1023),
            Some(INVALID)
        );
        let opted = FunctionLimits {
            max_dynamic_shared: SHARED_OPTIN_BYTES - 1024,
            ..LIMITS
        };
        assert!(check_dims("k", [1; 3], [32, 1, 1], SHARED_OPTIN_BYTES - 1024, opted).is_ok());
        assert!(check_dims("k", [1; 3], [32, 1, 1], SHARED_OPTIN_BYTES - 1023, opted).is_err());
    }
}
