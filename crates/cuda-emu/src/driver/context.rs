//! Driver state (`cuInit`), one primary context per visible device, and each thread's stack of
//! current contexts, with their C entry points (the `Context` type lives in stream.rs, beside the
//! streams it holds).
//!
//! Invariants: the driver is initialised at most once, by the first `cuInit`, from the
//! environment of that moment; contexts live for the whole process (a `CUcontext` is the address
//! of one, checked against the list before use); a context's sticky error, once set, is never
//! cleared and is returned by every later call that needs the context.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::{CUcontext, CUdevice, CUresult};

use super::config::{parse_config, Config};
pub(crate) use super::stream::Context;
use super::{log, out};

/// The initialised driver.
pub(crate) struct Driver {
    /// The configuration read at `cuInit`.
    pub(crate) config: Config,
    /// One primary context per driver ordinal.
    pub(crate) contexts: Vec<Context>,
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();

thread_local! {
    static STACK: RefCell<Vec<&'static Context>> = const { RefCell::new(Vec::new()) };
}

fn build() -> Result<Driver, CUresult> {
    let config = parse_config(|k| std::env::var(k).ok()).map_err(|e| {
        log(&format!("cuInit: {e}"));
        CUresult::CUDA_ERROR_INVALID_VALUE
    })?;
    if config.visible.is_empty() {
        return Err(CUresult::CUDA_ERROR_NO_DEVICE);
    }
    crate::space::init(config.visible.len(), config.memory).map_err(|e| {
        log(&format!("cuInit: {e}"));
        CUresult::CUDA_ERROR_OPERATING_SYSTEM
    })?;
    let contexts = (0..config.visible.len())
        .map(|d| Context::new(d as i32, config.delay))
        .collect();
    Ok(Driver { config, contexts })
}

/// The driver, or why it is not usable (`CUDA_ERROR_NOT_INITIALIZED` before `cuInit`).
pub(crate) fn driver() -> Result<&'static Driver, CUresult> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        Some(Err(code)) => Err(*code),
        None => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// The primary context of driver ordinal `device`.
pub(crate) fn context_of_device(device: CUdevice) -> Result<&'static Context, CUresult> {
    let d = driver()?;
    usize::try_from(device)
        .ok()
        .and_then(|i| d.contexts.get(i))
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// The context behind a `CUcontext` handle.
pub(crate) fn context_from_handle(handle: CUcontext) -> Result<&'static Context, CUresult> {
    let d = driver()?;
    d.contexts
        .iter()
        .find(|c| std::ptr::eq(*c as *const Context as *const u8, handle as *const u8))
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// The calling thread's current context, if any (no sticky check).
pub(crate) fn current_raw() -> Option<&'static Context> {
    STACK.with(|s| s.borrow().last().copied())
}

/// The current context, checked: initialised driver, a context bound, no sticky error.
pub(crate) fn current() -> Result<&'static Context, CUresult> {
    driver()?;
    let ctx = current_raw().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    ctx.check()?;
    Ok(ctx)
}

fn to_result(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(CUresult::CUDA_SUCCESS)
}

/// `cuInit`.
#[no_mangle]
pub unsafe extern "C" fn cuInit(Flags: c_uint) -> CUresult {
    if Flags != 0 {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    let result = DRIVER
        .get_or_init(build)
        .as_ref()
        .map(|_| ())
        .map_err(|c| *c);
    super::trace("cuInit");
    to_result(result)
}

/// `cuDriverGetVersion`: CUDA 13.0.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(driverVersion: *mut c_int) -> CUresult {
    super::trace("cuDriverGetVersion");
    // SAFETY: the caller's out-pointer (checked for null).
    unsafe { out(driverVersion, 13000) }
}

/// `cuDevicePrimaryCtxRetain`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    super::trace("cuDevicePrimaryCtxRetain");
    let ctx = match context_of_device(dev) {
        Ok(c) => c,
        Err(code) => return code,
    };
    ctx.retains.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the caller's out-pointer (checked for null).
    unsafe { out(pctx, ctx.handle()) }
}

/// `cuDevicePrimaryCtxRelease_v2`. The context's memory and streams are kept when the count
/// reaches zero (the emulator never tears a context down).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    super::trace("cuDevicePrimaryCtxRelease_v2");
    let ctx = match context_of_device(dev) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let released = ctx
        .retains
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    match released {
        Ok(_) => CUresult::CUDA_SUCCESS,
        Err(_) => CUresult::CUDA_ERROR_INVALID_CONTEXT,
    }
}

/// `cuDevicePrimaryCtxSetFlags_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: c_uint) -> CUresult {
    super::trace("cuDevicePrimaryCtxSetFlags_v2");
    match context_of_device(dev) {
        Ok(ctx) => {
            ctx.flags.store(flags, Ordering::SeqCst);
            CUresult::CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

/// `cuDevicePrimaryCtxGetState`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    super::trace("cuDevicePrimaryCtxGetState");
    let ctx = match context_of_device(dev) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let is_active = (ctx.retains.load(Ordering::SeqCst) > 0) as c_int;
    // SAFETY: the caller's out-pointers (checked for null).
    match unsafe { out(flags, ctx.flags.load(Ordering::SeqCst)) } {
        CUresult::CUDA_SUCCESS => unsafe { out(active, is_active) },
        code => code,
    }
}

/// `cuDevicePrimaryCtxReset_v2`: waits for the device; memory is kept.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    super::trace("cuDevicePrimaryCtxReset_v2");
    match context_of_device(dev) {
        Ok(ctx) => {
            let _ = ctx.synchronize();
            CUresult::CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

fn bind(ctx: CUcontext, replace_top: bool) -> CUresult {
    if ctx.is_null() {
        if replace_top {
            STACK.with(|s| s.borrow_mut().pop());
        }
        return CUresult::CUDA_SUCCESS;
    }
    match context_from_handle(ctx) {
        Ok(c) => {
            STACK.with(|s| {
                let mut s = s.borrow_mut();
                if replace_top {
                    s.pop();
                }
                s.push(c);
            });
            CUresult::CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

/// `cuCtxSetCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    super::trace("cuCtxSetCurrent");
    if let Err(code) = driver() {
        return code;
    }
    bind(ctx, true)
}

/// `cuCtxGetCurrent`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    super::trace("cuCtxGetCurrent");
    if let Err(code) = driver() {
        return code;
    }
    let handle = current_raw().map_or(std::ptr::null_mut(), |c| c.handle());
    // SAFETY: the caller's out-pointer (checked for null).
    unsafe { out(pctx, handle) }
}

/// `cuCtxPushCurrent_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    super::trace("cuCtxPushCurrent_v2");
    if let Err(code) = driver() {
        return code;
    }
    if ctx.is_null() {
        return CUresult::CUDA_ERROR_INVALID_CONTEXT;
    }
    bind(ctx, false)
}

/// `cuCtxPopCurrent_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    super::trace("cuCtxPopCurrent_v2");
    if let Err(code) = driver() {
        return code;
    }
    let Some(top) = STACK.with(|s| s.borrow_mut().pop()) else {
        return CUresult::CUDA_ERROR_INVALID_CONTEXT;
    };
    if pctx.is_null() {
        return CUresult::CUDA_SUCCESS;
    }
    // SAFETY: the caller's out-pointer (not null).
    unsafe { out(pctx, top.handle()) }
}

/// `cuCtxGetDevice`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    super::trace("cuCtxGetDevice");
    match current() {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(ctx) => unsafe { out(device, ctx.device) },
        Err(code) => code,
    }
}

/// `cuCtxSynchronize`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    super::trace("cuCtxSynchronize");
    match current() {
        Ok(ctx) => to_result(ctx.synchronize()),
        Err(code) => code,
    }
}

/// `cuCtxSetFlags`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetFlags(flags: c_uint) -> CUresult {
    super::trace("cuCtxSetFlags");
    match current() {
        Ok(ctx) => {
            ctx.flags.store(flags, Ordering::SeqCst);
            CUresult::CUDA_SUCCESS
        }
        Err(code) => code,
    }
}

/// `cuCtxGetFlags`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut c_uint) -> CUresult {
    super::trace("cuCtxGetFlags");
    match current() {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(ctx) => unsafe { out(flags, ctx.flags.load(Ordering::SeqCst)) },
        Err(code) => code,
    }
}

/// `cuCtxGetApiVersion`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut c_uint) -> CUresult {
    super::trace("cuCtxGetApiVersion");
    let found = if ctx.is_null() {
        current().map(|_| ())
    } else {
        context_from_handle(ctx).map(|_| ())
    };
    match found {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(()) => unsafe { out(version, 13000) },
        Err(code) => code,
    }
}

/// `cuCtxGetStreamPriorityRange`: priorities 0 (lowest) to -5 (highest), as on an H100/H200.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    leastPriority: *mut c_int,
    greatestPriority: *mut c_int,
) -> CUresult {
    super::trace("cuCtxGetStreamPriorityRange");
    if let Err(code) = current() {
        return code;
    }
    // SAFETY: the caller's out-pointers; either may be null (then it is not written).
    unsafe {
        if !leastPriority.is_null() {
            *leastPriority = 0;
        }
        if !greatestPriority.is_null() {
            *greatestPriority = -5;
        }
    }
    CUresult::CUDA_SUCCESS
}

/// Default values of the `CUlimit`s, by number (stack size, printf FIFO, malloc heap, runtime
/// sync depth, pending launches, L2 fetch granularity, persisting L2).
const LIMIT_DEFAULTS: [usize; 7] = [1024, 1 << 20, 8 << 20, 2, 2048, 32, 0];

static LIMITS: Mutex<Option<HashMap<(i32, u32), usize>>> = Mutex::new(None);

/// `cuCtxGetLimit`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetLimit(pvalue: *mut usize, limit: c_uint) -> CUresult {
    super::trace("cuCtxGetLimit");
    let ctx = match current() {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Some(&default) = LIMIT_DEFAULTS.get(limit as usize) else {
        return CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT;
    };
    let limits = LIMITS.lock().unwrap_or_else(|e| e.into_inner());
    let value = limits
        .as_ref()
        .and_then(|m| m.get(&(ctx.device, limit)).copied());
    // SAFETY: the caller's out-pointer (checked for null).
    unsafe { out(pvalue, value.unwrap_or(default)) }
}

/// `cuCtxSetLimit`: remembered and reported back (the emulator's kernels do not use them).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_uint, value: usize) -> CUresult {
    super::trace("cuCtxSetLimit");
    let ctx = match current() {
        Ok(c) => c,
        Err(code) => return code,
    };
    if limit as usize >= LIMIT_DEFAULTS.len() {
        return CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT;
    }
    let mut limits = LIMITS.lock().unwrap_or_else(|e| e.into_inner());
    limits
        .get_or_insert_with(HashMap::new)
        .insert((ctx.device, limit), value);
    CUresult::CUDA_SUCCESS
}

/// `cuCtxGetCacheConfig`: `CU_FUNC_CACHE_PREFER_NONE`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCacheConfig(pconfig: *mut c_uint) -> CUresult {
    super::trace("cuCtxGetCacheConfig");
    match current() {
        // SAFETY: the caller's out-pointer (checked for null).
        Ok(_) => unsafe { out(pconfig, 0) },
        Err(code) => code,
    }
}

/// `cuCtxSetCacheConfig`: accepted (the emulator has no L1/shared split).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCacheConfig(config: c_uint) -> CUresult {
    super::trace("cuCtxSetCacheConfig");
    match current() {
        Ok(_) if config <= 3 => CUresult::CUDA_SUCCESS,
        Ok(_) => CUresult::CUDA_ERROR_INVALID_VALUE,
        Err(code) => code,
    }
}

/// The ordinal of the current context's device (after `CUDA_VISIBLE_DEVICES` remapping).
pub fn current_device() -> Result<i32, CUresult> {
    current().map(|c| c.device)
}

/// Logs a call under `KILN_EMU_LOG=1`.
pub(crate) fn trace(call: &str) {
    if driver().is_ok_and(|d| d.config.log_calls) {
        log(call);
    }
}
