//! Kernel loading: CUDA C sources compiled at first use by NVRTC, cached per process.
//!
//! Each op family keeps its kernels in a `.cu` file beside the Rust that launches them and names
//! it with a [`KernelSource`] (`include_str!`, so the source ships inside the binary and no file
//! is read at run time). The first launch on a device compiles the file to PTX with NVRTC for
//! that device's compute capability, with the one option list [`crate::nvrtc_options`] (the same
//! list `cargo xtask kernels` checks in CI), then loads the PTX into the device's context.
//!
//! Three caches in memory, all per process and filled under a lock (a file is compiled once even when many
//! threads launch at once):
//! - PTX by (compute capability, file): two devices of the same arch share one compile;
//! - modules by (context, file): a file's PTX is loaded (and JIT-compiled by the driver, for
//!   every kernel in it) once per context, however many of its kernels are launched;
//! - functions by (context, file, function): a launch after the first is one map lookup.
//!
//! PTX is also kept on disk between processes ([`super::kernel_cache`]), so a run of many test
//! binaries compiles each file once, not once per binary.
//!
//! A test hook, `KILN_KERNEL_SOURCE_DIR` ([`super::source_override`]), swaps a file's built-in
//! source for a copy on disk (a planted bug); the disk cache key hashes the text compiled, so an
//! override never reuses PTX of other text.
//!
//! CUDA headers (`cuda_fp16.h`, `cuda_bf16.h`) are not built into NVRTC, so the loader looks for
//! a folder holding them once per process ([`cuda_include_dir`]) and passes it as
//! `--include-path` after the common options (as `cargo xtask kernels` does with its own copy).
//!
//! Failures are typed: NVRTC absent → [`Error::NvrtcNotFound`] (checked before any NVRTC call,
//! which would otherwise panic); a compile error → [`Error::KernelCompile`] carrying the file name
//! and NVRTC's log; a missing function → [`Error::KernelNotFound`].

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{result as nvrtc, Ptx};

use crate::error::{Error, Result};

/// A `.cu` file compiled by NVRTC at first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelSource {
    /// Path of the file relative to the crate's `src/` (shown in errors and NVRTC's log).
    pub file: &'static str,
    /// The CUDA C source (`include_str!` of the file).
    pub source: &'static str,
}

type PtxKey = ((u32, u32), &'static str);
type ModuleKey = (usize, &'static str);
type FunctionKey = (usize, &'static str, String);

static PTX: Mutex<Option<HashMap<PtxKey, Arc<str>>>> = Mutex::new(None);
static MODULES: Mutex<Option<HashMap<ModuleKey, Arc<CudaModule>>>> = Mutex::new(None);
static FUNCTIONS: Mutex<Option<HashMap<FunctionKey, CudaFunction>>> = Mutex::new(None);

fn chars_to_string(chars: Vec<c_char>) -> String {
    let bytes: Vec<u8> = chars
        .into_iter()
        .map(|c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Where to look for the CUDA headers, most explicit first: `$KILN_CUDA_INCLUDE`; `include/` of
/// `$CUDA_HOME`, `$CUDA_PATH`, `$CUDA_ROOT`; `../include` of each `LD_LIBRARY_PATH` folder (the
/// toolkit's `lib64/` and the pip wheels' `nvidia/cu13/lib/` both sit beside their `include/`);
/// the usual toolkit folders; `cargo xtask kernels`' cache; `/usr/include` (distribution packages).
pub fn include_dir_candidates(var: impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    out.extend(var("KILN_CUDA_INCLUDE").map(PathBuf::from));
    for root in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        out.extend(var(root).map(|r| Path::new(&r).join("include")));
    }
    if let Some(paths) = var("LD_LIBRARY_PATH") {
        out.extend(std::env::split_paths(&paths).map(|lib| lib.join("../include")));
    }
    out.extend(
        [
            "/usr/local/cuda/include",
            "/usr/local/cuda-13.0/include",
            "/opt/cuda/include",
        ]
        .map(PathBuf::from),
    );
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")));
    out.extend(cache.map(|c| c.join("kiln/cuda-13.0/nvidia/cu13/include")));
    out.push(PathBuf::from("/usr/include"));
    out
}

/// The first candidate folder holding `cuda_fp16.h`, `None` when there is none.
pub fn find_include_dir(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates
        .iter()
        .find(|dir| dir.join("cuda_fp16.h").is_file())
        .cloned()
}

/// The CUDA header folder kernels are compiled with (searched once; see
/// [`include_dir_candidates`]).
pub fn cuda_include_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| find_include_dir(&include_dir_candidates(|k| std::env::var(k).ok())))
        .as_deref()
}

/// The full NVRTC option list for `(major, minor)`: kiln's list plus the header folder.
fn options(major: u32, minor: u32) -> Vec<String> {
    let mut options = crate::nvrtc_options(major, minor);
    if let Some(dir) = cuda_include_dir() {
        options.push(format!("--include-path={}", dir.display()));
    }
    options
}

/// A hint for a log NVRTC wrote: how to fix what it says, when kiln knows.
fn hint_for(log: &str) -> String {
    if log.contains("could not open source file \"cuda_") {
        "\nhint: kiln found no CUDA headers: set KILN_CUDA_INCLUDE (or CUDA_HOME) to a folder holding \
         cuda_fp16.h, e.g. /usr/local/cuda/include or a `pip install nvidia-cuda-runtime` wheel's \
         nvidia/cu13/include"
            .to_string()
    } else {
        String::new()
    }
}

/// Compiles `kernel` to PTX for compute capability `(major, minor)`, or returns the cached PTX.
pub fn compile_ptx(kernel: &KernelSource, (major, minor): (u32, u32)) -> Result<Arc<str>> {
    if !super::probe::nvrtc_present() {
        return Err(Error::NvrtcNotFound);
    }
    let mut cache = PTX.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(ptx) = cache.get(&((major, minor), kernel.file)) {
        return Ok(ptx.clone());
    }
    let arch = major * 10 + minor;
    let options = options(major, minor);
    // The source (the test hook's override, if any: see `super::source_override`) with kiln's
    // shared headers spliced in (see `super::headers`).
    let source = super::source_override::kernel_text(kernel.file, kernel.source)?;
    let text = super::headers::expand_includes(&source, kernel.file);
    // Compiled by an earlier process? (see `kernel_cache`)
    let disk = super::kernel_cache::dir(|k| std::env::var(k).ok()).map(|dir| {
        let mut version = (0, 0);
        // SAFETY: NVRTC is present (checked above); both pointers are valid.
        let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut version.0, &mut version.1) };
        dir.join(super::kernel_cache::file_name(
            kernel.file,
            &text,
            &options,
            version,
            arch,
        ))
    });
    if let Some(text) = disk.as_deref().and_then(super::kernel_cache::read) {
        let ptx: Arc<str> = text.into();
        cache.insert(((major, minor), kernel.file), ptx.clone());
        return Ok(ptx);
    }
    let fail = |code: String, log: String| Error::KernelCompile {
        file: kernel.file,
        arch,
        code,
        hint: hint_for(&log),
        log,
    };
    let source = CString::new(text.as_str())
        .map_err(|_| fail("NUL byte in source".into(), String::new()))?;
    let name = CString::new(kernel.file)
        .map_err(|_| fail("NUL byte in file name".into(), String::new()))?;
    let prog = nvrtc::create_program(&source, Some(&name))
        .map_err(|e| fail(format!("{:?}", e.0), String::new()))?;
    // SAFETY: `prog` was created above and is destroyed once, below; `source` and `name` outlive it.
    let compiled = unsafe { nvrtc::compile_program(prog, &options) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::get_program_log(prog) }
        .map(chars_to_string)
        .unwrap_or_default();
    let ptx = match compiled {
        // SAFETY: as above; the program compiled.
        Ok(()) => unsafe { nvrtc::get_ptx(prog) }
            .map(chars_to_string)
            .map_err(|e| fail(format!("{:?}", e.0), log)),
        Err(e) => Err(fail(format!("{:?}", e.0), log)),
    };
    // SAFETY: as above; not used afterwards.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    let ptx: Arc<str> = ptx?.into();
    if let Some(path) = &disk {
        super::kernel_cache::write(path, &ptx);
    }
    cache.insert(((major, minor), kernel.file), ptx.clone());
    Ok(ptx)
}

/// The module of `kernel` in `ctx`: loaded on first use (compiling the file if needed), then
/// shared by every function of the file.
fn load_module(ctx: &Arc<CudaContext>, kernel: &KernelSource) -> Result<Arc<CudaModule>> {
    let key: ModuleKey = (ctx.cu_ctx() as usize, kernel.file);
    let mut cache = MODULES.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(m) = cache.get(&key) {
        return Ok(m.clone());
    }
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| super::driver_error("cuDeviceGetAttribute", e))?;
    let ptx = compile_ptx(kernel, (major as u32, minor as u32))?;
    let module = ctx
        .load_module(Ptx::from_src(ptx.to_string()))
        .map_err(|e| super::driver_error("cuModuleLoadData", e))?;
    cache.insert(key, module.clone());
    Ok(module)
}

/// The function `name` of `kernel`, loaded into `ctx` (compiling the file on first use).
pub fn load_function(
    ctx: &Arc<CudaContext>,
    kernel: &KernelSource,
    name: &str,
) -> Result<CudaFunction> {
    let key: FunctionKey = (ctx.cu_ctx() as usize, kernel.file, name.to_string());
    if let Some(f) = FUNCTIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|cache| cache.get(&key))
    {
        return Ok(f.clone());
    }
    let module = load_module(ctx, kernel)?;
    // The module may have been loaded on another thread: make the context current here.
    ctx.bind_to_thread()
        .map_err(|e| super::driver_error("cuCtxSetCurrent", e))?;
    let function = module.load_function(name).map_err(|e| {
        if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            Error::KernelNotFound {
                file: kernel.file,
                function: name.to_string(),
            }
        } else {
            super::driver_error("cuModuleGetFunction", e)
        }
    })?;
    FUNCTIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, function.clone());
    Ok(function)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BROKEN: KernelSource = KernelSource {
        file: "cuda/broken_for_test.cu",
        source: "extern \"C\" __global__ void kiln_broken(float* x) { x[0] = undeclared_name; }\n",
    };

    #[test]
    fn compile_errors_are_typed_and_carry_file_and_log() {
        match compile_ptx(&BROKEN, (8, 0)) {
            Err(Error::NvrtcNotFound) => {
                // Without NVRTC the loader must refuse with the typed error, never panic.
                assert!(!super::super::probe::nvrtc_present());
                let msg = Error::NvrtcNotFound.to_string();
                assert!(msg.starts_with("libnvrtc.so not found"), "{msg}");
                if crate::testing::cuda_required() {
                    panic!("KILN_REQUIRE_CUDA=1 but NVRTC is absent");
                }
            }
            Err(Error::KernelCompile {
                file, arch, log, ..
            }) => {
                assert_eq!(file, "cuda/broken_for_test.cu");
                assert_eq!(arch, 80);
                assert!(log.contains("undeclared_name"), "{log}");
            }
            other => panic!("expected a typed compile error, got {other:?}"),
        }
    }

    #[test]
    fn functions_of_one_file_share_one_module_in_any_thread() {
        let Some(dev) = crate::testing::cuda_device_or_skip() else {
            return;
        };
        let ctx = super::super::context(dev).unwrap();
        let fill = crate::ops::fill::cuda::FILL_KERNELS;
        let modules_of_fill = || {
            MODULES
                .lock()
                .unwrap()
                .as_ref()
                .map_or(0, |m| m.keys().filter(|k| k.1 == fill.file).count())
        };
        load_function(&ctx, &fill, "kiln_fill_f32").unwrap();
        load_function(&ctx, &fill, "kiln_fill_f64").unwrap();
        // A thread that never bound the context gets its function from the cached module.
        let other = ctx.clone();
        std::thread::spawn(move || load_function(&other, &fill, "kiln_fill_u8").unwrap())
            .join()
            .unwrap();
        assert_eq!(modules_of_fill(), 1, "one module per (context, file)");
        match load_function(&ctx, &fill, "kiln_no_such_kernel") {
            Err(Error::KernelNotFound { file, function }) => {
                assert_eq!(
                    (file, function.as_str()),
                    (fill.file, "kiln_no_such_kernel")
                );
            }
            other => panic!("expected KernelNotFound, got {other:?}"),
        }
    }

    #[test]
    fn include_dir_search_order_and_pick() {
        let vars = |k: &str| match k {
            "KILN_CUDA_INCLUDE" => Some("/explicit".to_string()),
            "CUDA_HOME" => Some("/opt/cuda-13".to_string()),
            "LD_LIBRARY_PATH" => Some("/w/nvidia/cu13/lib:/x/lib64".to_string()),
            "HOME" => Some("/home/u".to_string()),
            _ => None,
        };
        let got = include_dir_candidates(vars);
        let want: Vec<PathBuf> = [
            "/explicit",
            "/opt/cuda-13/include",
            "/w/nvidia/cu13/lib/../include",
            "/x/lib64/../include",
            "/usr/local/cuda/include",
            "/usr/local/cuda-13.0/include",
            "/opt/cuda/include",
            "/home/u/.cache/kiln/cuda-13.0/nvidia/cu13/include",
            "/usr/include",
        ]
        .map(PathBuf::from)
        .to_vec();
        assert_eq!(got, want);

        let root = std::env::temp_dir().join(format!("kiln-include-test-{}", std::process::id()));
        let (empty, headers) = (root.join("empty"), root.join("headers"));
        std::fs::create_dir_all(&empty).unwrap();
        std::fs::create_dir_all(&headers).unwrap();
        std::fs::write(headers.join("cuda_fp16.h"), "").unwrap();
        let picked = find_include_dir(&[root.join("missing"), empty.clone(), headers.clone()]);
        assert_eq!(picked, Some(headers));
        assert_eq!(find_include_dir(&[empty]), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn missing_header_logs_get_a_fix() {
        let log = "fill.cu(10): catastrophic error: could not open source file \"cuda_fp16.h\"";
        assert!(hint_for(log).contains("KILN_CUDA_INCLUDE"));
        assert_eq!(hint_for("error: identifier \"x\" is undefined"), "");
    }

    #[test]
    fn char_buffers_become_strings_up_to_the_nul() {
        let chars: Vec<c_char> = b"ptx\0junk".iter().map(|&b| b as c_char).collect();
        assert_eq!(chars_to_string(chars), "ptx");
    }
}
