//! The emulator's NVRTC: NVIDIA's C entry points (the ones cudarc 0.19 loads for kiln), compiling
//! with the host C++ compiler ([`compiler`]) instead of to PTX. The "PTX" handed back is an
//! [`image`] that `cuModuleLoadData` ([`crate::kernel::Module::load`]) understands.
//!
//! Invariants: a program handle is valid from `nvrtcCreateProgram` until `nvrtcDestroyProgram`
//! (a handle that is not live is `NVRTC_ERROR_INVALID_PROGRAM`, never dereferenced); the log is
//! always a NUL-terminated string (empty before a compile); the PTX exists only after a
//! successful compile.
//!
//! Configuration: `CXX` (the host compiler, default `g++`), `KILN_EMU_OPT` (`-O0`..`-O3`, default
//! `-O1`), `KILN_EMU_CACHE` (the module cache, default `~/.cache/kiln/cuda-emu`).

pub mod compiler;
pub mod image;
pub mod options;
pub mod scan;

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, Mutex};

use cudarc::nvrtc::sys::{nvrtcProgram, nvrtcResult};

/// What `nvrtcVersion` reports (the CUDA version kiln's cudarc is built for).
pub const VERSION: (c_int, c_int) = (13, 0);

struct ProgramState {
    name: String,
    source: String,
    headers: Vec<(String, String)>,
    log: CString,
    image: Option<CString>,
}

/// The live programs by handle (the address of their state).
type Registry = HashMap<usize, Arc<Mutex<ProgramState>>>;
static LIVE: Mutex<Option<Registry>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<Registry>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` on the program `prog`. The registry lock is held only to find the program, so
/// compiles of different programs run at once; a program destroyed meanwhile stays alive until
/// `f` returns.
fn with_program<R>(
    prog: nvrtcProgram,
    f: impl FnOnce(&mut ProgramState) -> R,
) -> Result<R, nvrtcResult> {
    let state = live()
        .as_ref()
        .and_then(|set| set.get(&(prog as usize)).cloned())
        .ok_or(nvrtcResult::NVRTC_ERROR_INVALID_PROGRAM)?;
    let mut guard = state.lock().unwrap_or_else(|e| e.into_inner());
    Ok(f(&mut guard))
}

fn status(r: Result<(), nvrtcResult>) -> nvrtcResult {
    r.err().unwrap_or(nvrtcResult::NVRTC_SUCCESS)
}

unsafe fn text(p: *const c_char) -> String {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe { CStr::from_ptr(p).to_string_lossy().into_owned() }
}

fn c_string(s: String) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// Compiles a program's text as `Module::load` needs when the cached object is gone.
pub fn rebuild(img: &image::Image) -> Result<compiler::Built, compiler::BuildFailure> {
    compiler::build(&compiler::Program {
        name: &img.name,
        source: &img.source,
        options: &img.options,
        headers: &img.headers,
    })
}

/// NVRTC's version: the CUDA release kiln is built for ([`VERSION`]).
#[no_mangle]
pub unsafe extern "C" fn nvrtcVersion(major: *mut c_int, minor: *mut c_int) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if major.is_null() || minor.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        *major = VERSION.0;
        *minor = VERSION.1;
        nvrtcResult::NVRTC_SUCCESS
    }
}

/// How many architectures `nvrtcGetSupportedArchs` lists.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetNumSupportedArchs(num: *mut c_int) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if num.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        *num = options::supported_archs().len() as c_int;
        nvrtcResult::NVRTC_SUCCESS
    }
}

/// The architectures `--gpu-architecture` accepts, as numbers (90 for compute_90).
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetSupportedArchs(archs: *mut c_int) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if archs.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        for (i, &a) in options::supported_archs().iter().enumerate() {
            *archs.add(i) = a as c_int;
        }
        nvrtcResult::NVRTC_SUCCESS
    }
}

/// NVRTC's name for each status, as `nvrtcGetErrorString` returns it.
const ERROR_STRINGS: [&CStr; 19] = [
    c"NVRTC_SUCCESS",
    c"NVRTC_ERROR_OUT_OF_MEMORY",
    c"NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
    c"NVRTC_ERROR_INVALID_INPUT",
    c"NVRTC_ERROR_INVALID_PROGRAM",
    c"NVRTC_ERROR_INVALID_OPTION",
    c"NVRTC_ERROR_COMPILATION",
    c"NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
    c"NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
    c"NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
    c"NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
    c"NVRTC_ERROR_INTERNAL_ERROR",
    c"NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
    c"NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
    c"NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
    c"NVRTC_ERROR_PCH_CREATE",
    c"NVRTC_ERROR_CANCELLED",
    c"NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
    c"NVRTC_ERROR_BUSY",
];

/// NVRTC's name of a status. Takes the status as its integer, so an out-of-range value is not
/// undefined behaviour.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetErrorString(result: u32) -> *const c_char {
    ERROR_STRINGS
        .get(result as usize)
        .copied()
        .unwrap_or(c"NVRTC_ERROR unknown")
        .as_ptr()
}

/// Creates a program from its source, name and named headers (copied).
#[no_mangle]
pub unsafe extern "C" fn nvrtcCreateProgram(
    prog: *mut nvrtcProgram,
    src: *const c_char,
    name: *const c_char,
    num_headers: c_int,
    headers: *const *const c_char,
    include_names: *const *const c_char,
) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if prog.is_null() || src.is_null() || num_headers < 0 {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        if num_headers > 0 && (headers.is_null() || include_names.is_null()) {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        let mut named = Vec::new();
        for i in 0..num_headers as usize {
            let (h, n) = (*headers.add(i), *include_names.add(i));
            if h.is_null() || n.is_null() {
                return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
            }
            named.push((text(n), text(h)));
        }
        let state = Arc::new(Mutex::new(ProgramState {
            name: if name.is_null() {
                "default_program".into()
            } else {
                text(name)
            },
            source: text(src),
            headers: named,
            log: CString::default(),
            image: None,
        }));
        let handle = Arc::as_ptr(&state) as usize;
        live()
            .get_or_insert_with(HashMap::new)
            .insert(handle, state);
        *prog = handle as nvrtcProgram;
        nvrtcResult::NVRTC_SUCCESS
    }
}

/// Destroys a program and nulls the handle.
#[no_mangle]
pub unsafe extern "C" fn nvrtcDestroyProgram(prog: *mut nvrtcProgram) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if prog.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        let handle = *prog;
        if live()
            .as_mut()
            .and_then(|set| set.remove(&(handle as usize)))
            .is_none()
        {
            return nvrtcResult::NVRTC_ERROR_INVALID_PROGRAM;
        }
        *prog = std::ptr::null_mut();
        nvrtcResult::NVRTC_SUCCESS
    }
}

/// Compiles a program with the host C++ compiler (see [`compiler`]); the log says why it failed.
#[no_mangle]
pub unsafe extern "C" fn nvrtcCompileProgram(
    prog: nvrtcProgram,
    num_options: c_int,
    options: *const *const c_char,
) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if num_options < 0 || (num_options > 0 && options.is_null()) {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        let mut opts = Vec::new();
        for i in 0..num_options as usize {
            let o = *options.add(i);
            if o.is_null() {
                return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
            }
            opts.push(text(o));
        }
        let r = with_program(prog, |state| {
            state.image = None;
            let program = compiler::Program {
                name: &state.name,
                source: &state.source,
                options: &opts,
                headers: &state.headers,
            };
            match compiler::build(&program) {
                Ok(built) => {
                    state.log = c_string(built.log);
                    let img = image::Image {
                        hash: built.hash,
                        kernels: built.kernels,
                        target: options::parse(&opts).map_or(0, |o| o.cuda_arch / 10),
                        name: state.name.clone(),
                        options: opts.clone(),
                        headers: state.headers.clone(),
                        source: state.source.clone(),
                    };
                    state.image = Some(c_string(image::encode(&img)));
                    nvrtcResult::NVRTC_SUCCESS
                }
                Err(failure) => {
                    state.log = c_string(failure.log);
                    failure.code
                }
            }
        });
        r.unwrap_or_else(|e| e)
    }
}

/// Bytes of the compiled image, its NUL included.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTXSize(prog: nvrtcProgram, size: *mut usize) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if size.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        status(
            with_program(prog, |s| match &s.image {
                Some(img) => {
                    *size = img.as_bytes_with_nul().len();
                    Ok(())
                }
                None => Err(nvrtcResult::NVRTC_ERROR_INVALID_PROGRAM),
            })
            .and_then(|r| r),
        )
    }
}

/// Copies the compiled image (NUL-terminated) to `ptx`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetPTX(prog: nvrtcProgram, ptx: *mut c_char) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if ptx.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        status(
            with_program(prog, |s| match &s.image {
                Some(img) => {
                    let bytes = img.as_bytes_with_nul();
                    std::ptr::copy_nonoverlapping(
                        bytes.as_ptr() as *const c_char,
                        ptx,
                        bytes.len(),
                    );
                    Ok(())
                }
                None => Err(nvrtcResult::NVRTC_ERROR_INVALID_PROGRAM),
            })
            .and_then(|r| r),
        )
    }
}

/// Bytes of the compile log, its NUL included.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLogSize(
    prog: nvrtcProgram,
    size: *mut usize,
) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if size.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        status(with_program(prog, |s| {
            *size = s.log.as_bytes_with_nul().len();
        }))
    }
}

/// Copies the compile log (NUL-terminated) to `log`.
#[no_mangle]
pub unsafe extern "C" fn nvrtcGetProgramLog(prog: nvrtcProgram, log: *mut c_char) -> nvrtcResult {
    // SAFETY: the caller passes pointers valid as NVRTC documents them (checked for null).
    unsafe {
        if log.is_null() {
            return nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
        }
        status(with_program(prog, |s| {
            let bytes = s.log.as_bytes_with_nul();
            std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, log, bytes.len());
        }))
    }
}
