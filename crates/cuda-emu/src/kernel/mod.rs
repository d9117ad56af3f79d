//! Compiled modules and kernel launches: a module is the shared object the emulator's NVRTC
//! built ([`crate::nvrtc`]), `dlopen`ed; a kernel's arguments are copied by its real signature
//! (the descriptor the compiler driver appended to the module); a launch runs every block on
//! the launching thread and a pool of helpers (`pool`), each block's threads as fibers
//! (include/kiln_emu_fiber.h).
//!
//! Invariants:
//! - A module stays loaded for the life of the process (functions and running kernels point
//!   into it; `dlclose` of an object with thread-local storage is never safe here).
//! - Every pointer argument of a launch is null or inside a live device allocation when it is
//!   captured; anything else is refused before the kernel runs.
//! - Every error names the kernel; a fault names the block, the thread and the address.
//!
//! Configuration: `KILN_EMU_SCHEDULE` (`inorder`, the default; `reverse`; `random`, seeded by
//! `KILN_EMU_SEED`) orders a block's threads between barriers, so a race from a missing
//! `__syncthreads` reproduces; `KILN_EMU_THREADS` sets the OS threads per launch.

mod abi;
mod fault;
mod pool;

use cudarc::driver::sys::CUresult;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::Arc;

use crate::nvrtc::{compiler, image};

/// Threads per block the H200 allows (the limit without `__launch_bounds__`).
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

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
    handle: *mut c_void,
    run_blocks: abi::RunBlocks,
    tls_size: usize,
    dynamic_shared_bytes: u32,
    name: String,
}

// SAFETY: the handle and the runner are process-wide and immutable once loaded; dlsym and
// dlinfo on a handle are thread-safe.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

fn invalid_image(message: String) -> LaunchError {
    LaunchError {
        code: CUresult::CUDA_ERROR_INVALID_IMAGE,
        message,
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a thread-local C string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (see above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Bytes of the thread-local block of the object loaded as `handle`.
fn tls_size(handle: *mut c_void) -> usize {
    let mut modid: libc::size_t = 0;
    // SAFETY: RTLD_DI_TLS_MODID writes one size_t.
    let ok = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_TLS_MODID,
            &mut modid as *mut libc::size_t as *mut c_void,
        )
    };
    if ok != 0 || modid == 0 {
        return 0;
    }
    struct Search {
        modid: usize,
        size: usize,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _: libc::size_t,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `Search`.
        unsafe {
            let search = &mut *(data as *mut Search);
            let info = &*info;
            if info.dlpi_tls_modid != search.modid {
                return 0;
            }
            for i in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type == libc::PT_TLS {
                    search.size = ph.p_memsz as usize;
                }
            }
            1
        }
    }
    let mut search = Search { modid, size: 0 };
    // SAFETY: `visit` only reads the headers and writes `search`.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    search.size
}

impl Module {
    /// Loads an image handed to `cuModuleLoadData` (NUL-terminated text made by the emulator's
    /// NVRTC; anything else, e.g. real PTX, is `CUDA_ERROR_INVALID_IMAGE` with a message).
    pub unsafe fn load(image: *const c_void) -> Result<Arc<Module>, LaunchError> {
        if image.is_null() {
            return Err(LaunchError {
                code: CUresult::CUDA_ERROR_INVALID_VALUE,
                message: "cuModuleLoadData: the image is a null pointer".into(),
            });
        }
        // SAFETY: the caller passes a NUL-terminated image (cuModuleLoadData's contract).
        let text = unsafe { CStr::from_ptr(image as *const c_char) }.to_string_lossy();
        let img = image::decode(&text).map_err(invalid_image)?;
        let library = compiler::cache_dir()
            .join("modules")
            .join(format!("{}.so", img.hash));
        let library = if library.is_file() {
            library
        } else {
            let built = crate::nvrtc::rebuild(&img).map_err(|f| {
                invalid_image(format!(
                    "module {}: its compiled object is not in the cache and compiling it again \
                     failed:\n{}",
                    img.name, f.log
                ))
            })?;
            built.library
        };
        Self::open(&library, &img.name)
    }

    fn open(library: &Path, name: &str) -> Result<Arc<Module>, LaunchError> {
        let path = CString::new(library.as_os_str().as_encoded_bytes())
            .map_err(|_| invalid_image(format!("module {name}: bad cache path")))?;
        // SAFETY: dlopen of a shared object the emulator's NVRTC built.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(invalid_image(format!(
                "module {name}: cannot load {}: {}",
                library.display(),
                dl_error()
            )));
        }
        // SAFETY: dlsym on a live handle.
        let run = unsafe { libc::dlsym(handle, c"kiln_emu_run_blocks".as_ptr()) };
        if run.is_null() {
            return Err(invalid_image(format!(
                "module {name}: {} has no block runner",
                library.display()
            )));
        }
        // SAFETY: dlsym on a live handle; the symbol, when present, is a const unsigned.
        let dynamic = unsafe { libc::dlsym(handle, c"kiln_emu_dynamic_shared_bytes".as_ptr()) };
        let dynamic_shared_bytes = if dynamic.is_null() {
            0
        } else {
            // SAFETY: see above.
            unsafe { *(dynamic as *const u32) }
        };
        Ok(Arc::new(Module {
            handle,
            // SAFETY: the symbol is kiln_emu_run_blocks of include/kiln_emu_fiber.h.
            run_blocks: unsafe { std::mem::transmute::<*mut c_void, abi::RunBlocks>(run) },
            tls_size: tls_size(handle),
            dynamic_shared_bytes,
            name: name.to_string(),
        }))
    }

    /// The `extern "C" __global__` function `name` (`CUDA_ERROR_NOT_FOUND` when absent).
    pub fn function(self: &Arc<Self>, name: &str) -> Result<Function, LaunchError> {
        let not_found = || LaunchError {
            code: CUresult::CUDA_ERROR_NOT_FOUND,
            message: format!(
                "module {} has no extern \"C\" __global__ function {name}",
                self.name
            ),
        };
        let symbol = CString::new(format!("kiln_emu_info_{name}")).map_err(|_| not_found())?;
        // SAFETY: dlsym on a live handle.
        let info = unsafe { libc::dlsym(self.handle, symbol.as_ptr()) } as *const abi::KernelInfo;
        if info.is_null() {
            return Err(not_found());
        }
        // SAFETY: the symbol is a kiln_emu_kernel_info the module defines.
        if unsafe { (*info).abi } != abi::ABI {
            return Err(invalid_image(format!(
                "module {}: kernel {name} was built for another runtime ABI",
                self.name
            )));
        }
        Ok(Function {
            name: name.to_string(),
            module: self.clone(),
            info: info as usize,
        })
    }
}

/// One kernel of a module.
#[derive(Clone)]
pub struct Function {
    name: String,
    module: Arc<Module>,
    info: usize,
}

/// A launch's arguments copied out of the caller's `void**` at launch time, by the kernel's
/// real signature (the caller's memory may be gone when the kernel runs).
pub struct CapturedArgs {
    storage: Vec<u128>,
    offsets: Vec<usize>,
}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn info(&self) -> &abi::KernelInfo {
        // SAFETY: the descriptor lives in the module, which `self.module` keeps loaded.
        unsafe { &*(self.info as *const abi::KernelInfo) }
    }

    fn error(&self, code: CUresult, what: String) -> LaunchError {
        LaunchError {
            code,
            message: format!("kernel {}: {what}", self.name),
        }
    }

    /// The most threads per block a launch may use: `__launch_bounds__`' first value, else the
    /// device limit (a bigger block is `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`, as on a GPU).
    pub fn max_threads_per_block(&self) -> u32 {
        match self.info().max_threads {
            0 => MAX_THREADS_PER_BLOCK,
            n => n.min(MAX_THREADS_PER_BLOCK),
        }
    }

    /// Copies the arguments `params` points at (one pointer per parameter of the real signature)
    /// and checks every pointer parameter is null or inside a live device allocation
    /// (`CUDA_ERROR_INVALID_VALUE` naming the kernel and argument otherwise).
    pub unsafe fn capture(&self, params: *mut *mut c_void) -> Result<CapturedArgs, LaunchError> {
        let info = self.info();
        let count = info.param_count as usize;
        let invalid = |what: String| self.error(CUresult::CUDA_ERROR_INVALID_VALUE, what);
        if count > 0 && params.is_null() {
            return Err(invalid(format!(
                "kernelParams is null, but the kernel takes {count} parameters"
            )));
        }
        let mut offsets = Vec::with_capacity(count);
        let mut end = 0usize;
        for i in 0..count {
            // SAFETY: the descriptor's arrays have param_count entries.
            let (size, align) = unsafe {
                (
                    *info.param_sizes.add(i) as usize,
                    *info.param_aligns.add(i) as usize,
                )
            };
            if align > 16 {
                return Err(invalid(format!(
                    "argument {i} is aligned to {align} bytes; at most 16 are supported"
                )));
            }
            let at = end.div_ceil(align.max(1)) * align.max(1);
            offsets.push(at);
            end = at + size;
        }
        let mut storage = vec![0u128; end.div_ceil(16).max(1)];
        let base = storage.as_mut_ptr() as *mut u8;
        for (i, &at) in offsets.iter().enumerate() {
            // SAFETY: `params` has one entry per parameter (cuLaunchKernel's contract).
            let src = unsafe { *params.add(i) } as *const u8;
            if src.is_null() {
                return Err(invalid(format!("kernelParams[{i}] is a null pointer")));
            }
            // SAFETY: as above; each entry points at a value of the parameter's size; the
            // destination range lies inside `storage`.
            let size = unsafe { *info.param_sizes.add(i) } as usize;
            unsafe { std::ptr::copy_nonoverlapping(src, base.add(at), size) };
            // SAFETY: the descriptor's arrays have param_count entries.
            if unsafe { *info.param_is_pointer.add(i) } != 0 && size == 8 {
                // SAFETY: 8 bytes were just copied at `at`.
                let ptr = unsafe { std::ptr::read_unaligned(base.add(at) as *const u64) };
                if ptr != 0 {
                    if let Err(e) = crate::space::check_device_range(ptr, 0) {
                        return Err(invalid(format!(
                            "argument {i} is 0x{ptr:x}, not device memory (a host pointer \
                             handed to a kernel?): {e}"
                        )));
                    }
                }
            }
        }
        Ok(CapturedArgs { storage, offsets })
    }

    /// Runs the whole grid now, on the calling thread and helpers; returns after the last block.
    pub fn run(&self, dims: LaunchDims, args: &CapturedArgs) -> Result<(), LaunchError> {
        let threads = dims.block.iter().map(|&d| d as u64).product::<u64>();
        if threads == 0 || dims.grid.contains(&0) {
            return Err(self.error(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("empty launch: grid {:?}, block {:?}", dims.grid, dims.block),
            ));
        }
        if threads > self.max_threads_per_block() as u64 {
            return Err(self.error(
                CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                format!(
                    "{threads} threads per block, but the kernel allows at most {}",
                    self.max_threads_per_block()
                ),
            ));
        }
        let room = self.module.dynamic_shared_bytes;
        if room > 0 && dims.shared_bytes > room {
            return Err(self.error(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{} bytes of dynamic shared memory, but the emulator gives a block at most \
                     {room}",
                    dims.shared_bytes
                ),
            ));
        }
        let base = args.storage.as_ptr() as *const u8;
        let pointers: Vec<*mut c_void> = args
            .offsets
            .iter()
            // SAFETY: every offset lies inside `storage` (see `capture`).
            .map(|&at| unsafe { base.add(at) } as *mut c_void)
            .collect();
        let (schedule, seed) = schedule();
        let grid = pool::Grid {
            run_blocks: self.module.run_blocks,
            dl_handle: self.module.handle,
            tls_size: self.module.tls_size,
            entry: self.info().entry,
            args: pointers.as_ptr(),
            grid: dims.grid,
            block: dims.block,
            schedule,
            seed,
        };
        pool::run_grid(grid).map_err(|(code, message)| {
            let (code, detail) = match code {
                abi::RUN_FAULT => (CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, fault_detail(&message)),
                _ => (CUresult::CUDA_ERROR_LAUNCH_FAILED, String::new()),
            };
            self.error(code, format!("{message}{detail}"))
        })
    }

    /// Static shared memory bytes per block the kernel declares (for the driver's limit check
    /// and `cuFuncGetAttribute`). An upper bound: every `__shared__` variable of the module
    /// (they share one thread-local block), without the dynamic shared arrays.
    pub fn static_shared_bytes(&self) -> u32 {
        let runtime = std::mem::size_of::<usize>();
        let dynamic = self.module.dynamic_shared_bytes as usize;
        self.module.tls_size.saturating_sub(runtime + dynamic) as u32
    }
}

/// `KILN_EMU_SCHEDULE` (`inorder`, `reverse`, `random`) and `KILN_EMU_SEED`.
fn schedule() -> (u32, u64) {
    let kind = match std::env::var("KILN_EMU_SCHEDULE").as_deref() {
        Ok("reverse") => 1,
        Ok("random") => 2,
        _ => 0,
    };
    let seed = std::env::var("KILN_EMU_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001);
    (kind, seed)
}

/// Says where a faulting address lies, from the runner's message "... at address 0x...".
fn fault_detail(message: &str) -> String {
    let Some(hex) = message.split("at address 0x").nth(1).map(|r| {
        r.split(|c: char| !c.is_ascii_hexdigit())
            .next()
            .unwrap_or("")
    }) else {
        return String::new();
    };
    let Ok(addr) = u64::from_str_radix(hex, 16) else {
        return String::new();
    };
    match crate::space::device_of(addr) {
        Some(device) => format!(
            " (inside device {device}'s address range but outside every live allocation: out of \
             bounds, or freed)"
        ),
        None if addr == 0 => " (a null pointer, or a non-canonical garbage address)".into(),
        None => " (outside every device's memory: a host pointer or garbage)".into(),
    }
}
