//! Shared helpers of the kernel-runtime tests: compile a source with the emulator's NVRTC entry
//! points, load it, launch a kernel with host-side argument values.
#![allow(dead_code)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::nvrtc::sys::nvrtcResult;
use kiln_cuda_emu::kernel::{LaunchDims, LaunchError, Module};
use kiln_cuda_emu::nvrtc;

/// The options kiln compiles every kernel with.
pub fn kiln_options() -> Vec<String> {
    kiln_device::nvrtc_options(9, 0)
}

/// Compiles `source` as program `name`; the image text, or the status and the log.
pub fn compile(
    name: &str,
    source: &str,
    options: &[String],
) -> Result<String, (nvrtcResult, String)> {
    compile_with_headers(name, source, options, &[])
}

fn c_strings(list: impl Iterator<Item = String>) -> Vec<CString> {
    list.map(|s| CString::new(s).unwrap()).collect()
}

fn pointers(list: &[CString]) -> Vec<*const c_char> {
    list.iter().map(|s| s.as_ptr()).collect()
}

/// As [`compile`], with named headers (include name, text) given to nvrtcCreateProgram.
pub fn compile_with_headers(
    name: &str,
    source: &str,
    options: &[String],
    headers: &[(&str, &str)],
) -> Result<String, (nvrtcResult, String)> {
    let texts = c_strings(headers.iter().map(|(_, t)| t.to_string()));
    let names = c_strings(headers.iter().map(|(n, _)| n.to_string()));
    let opts = c_strings(options.iter().cloned());
    let (texts_p, names_p, opts_p) = (pointers(&texts), pointers(&names), pointers(&opts));
    let src = CString::new(source).unwrap();
    let cname = CString::new(name).unwrap();
    unsafe {
        let mut prog = std::ptr::null_mut();
        let r = nvrtc::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            headers.len() as i32,
            texts_p.as_ptr(),
            names_p.as_ptr(),
        );
        assert_eq!(r, nvrtcResult::NVRTC_SUCCESS);
        let r = nvrtc::nvrtcCompileProgram(prog, opts_p.len() as i32, opts_p.as_ptr());
        let mut size = 0;
        assert_eq!(
            nvrtc::nvrtcGetProgramLogSize(prog, &mut size),
            nvrtcResult::NVRTC_SUCCESS
        );
        let mut log = vec![0u8; size];
        assert_eq!(
            nvrtc::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut _),
            nvrtcResult::NVRTC_SUCCESS
        );
        let log = CStr::from_bytes_until_nul(&log)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let out = if r == nvrtcResult::NVRTC_SUCCESS {
            assert_eq!(
                nvrtc::nvrtcGetPTXSize(prog, &mut size),
                nvrtcResult::NVRTC_SUCCESS
            );
            let mut ptx = vec![0u8; size];
            assert_eq!(
                nvrtc::nvrtcGetPTX(prog, ptx.as_mut_ptr() as *mut _),
                nvrtcResult::NVRTC_SUCCESS
            );
            Ok(CStr::from_bytes_until_nul(&ptx)
                .unwrap()
                .to_string_lossy()
                .into_owned())
        } else {
            assert_eq!(
                nvrtc::nvrtcGetPTXSize(prog, &mut size),
                nvrtcResult::NVRTC_ERROR_INVALID_PROGRAM
            );
            Err((r, log))
        };
        assert_eq!(
            nvrtc::nvrtcDestroyProgram(&mut prog),
            nvrtcResult::NVRTC_SUCCESS
        );
        assert!(prog.is_null());
        out
    }
}

/// Loads a compiled image.
pub fn load_image(image: String) -> Result<Arc<Module>, LaunchError> {
    let image = CString::new(image).unwrap();
    unsafe { Module::load(image.as_ptr() as *const c_void) }
}

/// Compiles and loads `source`, panicking with the log on failure.
pub fn load(name: &str, source: &str) -> Arc<Module> {
    let image =
        compile(name, source, &kiln_options()).unwrap_or_else(|(c, log)| panic!("{c:?}\n{log}"));
    load_image(image).unwrap_or_else(|e| panic!("{}", e.message))
}

/// One argument value, passed to the launch by address as cuLaunchKernel takes it.
pub enum Arg {
    U64(u64),
    U32(u32),
    F32(f32),
}

/// Launches `kernel` of `module` with `args`.
pub fn launch(
    module: &Arc<Module>,
    kernel: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &[Arg],
) -> Result<(), LaunchError> {
    launch_shared(module, kernel, grid, block, 0, args)
}

/// As [`launch`], with `shared_bytes` of dynamic shared memory per block.
pub fn launch_shared(
    module: &Arc<Module>,
    kernel: &str,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    args: &[Arg],
) -> Result<(), LaunchError> {
    let f = module.function(kernel)?;
    let mut values: Vec<u64> = args
        .iter()
        .map(|a| match a {
            Arg::U64(v) => *v,
            Arg::U32(v) => *v as u64,
            Arg::F32(v) => v.to_bits() as u64,
        })
        .collect();
    let mut params: Vec<*mut c_void> = values
        .iter_mut()
        .map(|v| v as *mut u64 as *mut c_void)
        .collect();
    let captured = unsafe { f.capture(params.as_mut_ptr()) }?;
    f.run(
        LaunchDims {
            grid,
            block,
            shared_bytes,
        },
        &captured,
    )
}

/// Asserts a launch failed with `code` and a message containing every one of `parts`.
pub fn assert_fails(r: Result<(), LaunchError>, code: CUresult, parts: &[&str]) {
    let e = r.expect_err("the launch should fail");
    assert_eq!(e.code, code, "{}", e.message);
    for p in parts {
        assert!(e.message.contains(p), "missing {p:?} in: {}", e.message);
    }
}
