//! `cargo xtask kernels`: compile every CUDA C kernel in the workspace the way a GPU will.
//!
//! kiln's kernels are `.cu` files beside the Rust that launches them; at run time kiln-device
//! compiles each with NVRTC for the device's architecture. A kernel that does not compile is
//! therefore only discovered on a GPU machine, unless CI compiles it first. This command does:
//!
//! 1. finds every `*.cu` file under `crates/` (skipping `target/` and hidden folders); none at
//!    all is an error, since CI must compile the shipped kernels;
//! 2. finds or installs NVRTC 13.0, `ptxas` and the fp16/bf16 headers (see [`crate::cuda_tools`]);
//! 3. re-executes itself with `LD_LIBRARY_PATH` naming the wheel's `lib/` folder: cudarc loads
//!    `libnvrtc.so.13` with `dlopen`, and libnvrtc in turn `dlopen`s `libnvrtc-builtins.so.13.0`
//!    by bare name, so the folder must be on the loader's path, which is read at process start;
//! 4. compiles each file (several at once, one per core) to PTX for `compute_80` and
//!    `compute_90` with exactly [`kiln_device::nvrtc_options`] (the runtime's options) plus
//!    `--include-path` for `cuda_fp16.h` / `cuda_bf16.h`, then assembles the PTX with
//!    `ptxas -arch=sm_80` / `sm_90`, which catches register and resource errors NVRTC does not;
//! 5. prints one line per file, in path order, and fails (non-zero exit) with the NVRTC log or
//!    ptxas output of every failure; warnings count as failures, as with `clippy -D warnings`.
//!    PTX and cubins are left in `target/kiln-kernels/` for inspection.

use rayon::prelude::*;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cuda_tools::{self, CudaTools};

/// The (major, minor) compute capabilities every kernel must compile for: A100 and H100/H200.
pub const ARCHS: [(u32, u32); 2] = [(8, 0), (9, 0)];

/// Set in the re-executed child to the lib folder it was given, so it does not re-exec again.
const REEXEC_MARKER: &str = "KILN_XTASK_NVRTC_LIB_DIR";

/// Runs `cargo xtask kernels`.
pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!(
            "`kernels` takes no arguments (got `{arg}`); it always compiles every .cu file under \
             crates/ for sm_80 and sm_90"
        ));
    }
    let root = crate::paths::workspace_root();
    let files = find_cu_files(&root.join("crates"))?;
    if files.is_empty() {
        return Err(format!(
            "no .cu files found under {}: CI must compile the shipped kernels, so a workspace \
             without any is an error (kernels live beside their Rust, e.g. \
             crates/device/src/ops/fill/fill.cu)",
            root.join("crates").display()
        ));
    }

    let tools = cuda_tools::find_or_install()?;
    ensure_nvrtc_on_loader_path(&tools)?;

    // SAFETY: probing for a shared library has no preconditions; it only dlopens candidates.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(format!(
            "libnvrtc.so.13 did not load although LD_LIBRARY_PATH starts with {}; remove that \
             folder so that the wheels are installed afresh",
            tools.lib_dir.display()
        ));
    }
    let (major, minor) = nvrtc_version();
    if major != 13 {
        return Err(format!(
            "loaded NVRTC {major}.{minor}, expected 13.x: another libnvrtc on the loader path \
             shadows {}; unset LD_LIBRARY_PATH entries that hold other CUDA versions",
            tools.lib_dir.display()
        ));
    }
    println!(
        "NVRTC {major}.{minor} ({}), ptxas {}",
        tools.lib_dir.display(),
        tools.ptxas.display()
    );

    let out_dir = crate::paths::target_dir(&root).join("kiln-kernels");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;

    // Files compile in parallel (NVRTC's compile is thread-safe; each file writes its own
    // outputs) and are reported in path order.
    let checked: Vec<(String, Result<usize, String>)> = files
        .par_iter()
        .map(|file| {
            let rel = file
                .strip_prefix(&root)
                .unwrap_or(file)
                .display()
                .to_string();
            let result = check_file(file, &rel, &tools, &out_dir);
            (rel, result)
        })
        .collect();
    let mut failures = Vec::new();
    for (rel, result) in checked {
        match result {
            Ok(kernels) => {
                let archs: Vec<String> = ARCHS.iter().map(|(a, b)| format!("sm_{a}{b}")).collect();
                let plural = if kernels == 1 { "" } else { "s" };
                println!(
                    "ok    {rel}  {}  ({kernels} kernel{plural})",
                    archs.join(" ")
                );
            }
            Err(message) => {
                println!("FAIL  {rel}");
                for line in message.lines() {
                    println!("      {line}");
                }
                failures.push(rel);
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} kernel files failed to compile: {}",
            failures.len(),
            files.len(),
            failures.join(", ")
        ))
    }
}

/// Every `*.cu` file under `dir`, sorted, skipping `target/` and hidden folders.
pub fn find_cu_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
            if kind.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    pending.push(path);
                }
            } else if name.ends_with(".cu") {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Re-executes this process with the tools' lib folder first on `LD_LIBRARY_PATH`, unless this
/// process is already that re-executed child. Returns only in the child.
fn ensure_nvrtc_on_loader_path(tools: &CudaTools) -> Result<(), String> {
    let lib = tools.lib_dir.as_os_str();
    if std::env::var_os(REEXEC_MARKER).as_deref() == Some(lib) {
        return Ok(());
    }
    let mut paths = vec![tools.lib_dir.clone()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&old));
    }
    let joined = std::env::join_paths(paths).map_err(|e| {
        format!(
            "cannot build LD_LIBRARY_PATH with {}: {e}",
            tools.lib_dir.display()
        )
    })?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find xtask's own path: {e}"))?;
    let mut command = Command::new(&exe);
    command
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", joined)
        .env(REEXEC_MARKER, lib);
    exec(command, &exe)
}

#[cfg(unix)]
fn exec(mut command: Command, exe: &Path) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let error = command.exec(); // returns only on failure
    Err(format!("cannot re-execute {}: {error}", exe.display()))
}

#[cfg(not(unix))]
fn exec(_command: Command, _exe: &Path) -> Result<(), String> {
    Err(
        "`cargo xtask kernels` needs Linux (the NVRTC/ptxas wheels are Linux x86_64/aarch64)"
            .into(),
    )
}

/// NVRTC's (major, minor) version. Call only after `is_culib_present()` returned true.
fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked by the caller) and both pointers are valid.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (major, minor)
}

/// NVRTC then ptxas, for every arch in [`ARCHS`]; the number of kernels (`.entry` points), or
/// every error and warning. Warnings fail the check, as `clippy -D warnings` does for Rust: a
/// kernel's warning is usually a bug (an unused parameter, a narrowing index).
fn check_file(file: &Path, rel: &str, tools: &CudaTools, out_dir: &Path) -> Result<usize, String> {
    let source = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    // kiln's shared headers spliced in exactly as the runtime loader does.
    let source = kiln_device::cuda::headers::expand_includes(&source, rel);
    let stem = rel.trim_end_matches(".cu").replace(['/', '\\'], "__");
    let mut errors: Vec<(String, String, String)> = Vec::new();
    // Most errors read the same for every arch: report each distinct output once.
    let mut report = |label: String, detail: String, body: &str| {
        let body = body.trim_end().to_string();
        let first = errors.iter().find(|(_, _, seen)| *seen == body);
        match first.map(|(first, _, _)| first.clone()) {
            Some(first) => {
                errors.push((label, "same output as ".to_string() + &first, String::new()))
            }
            None => errors.push((label, detail, body)),
        }
    };
    let mut kernels = 0;
    for (major, minor) in ARCHS {
        let arch = format!("sm_{major}{minor}");
        let ptx = match compile_ptx(&source, rel, major, minor, tools) {
            Ok((ptx, log)) => {
                if !log.trim().is_empty() {
                    let detail = "warned; warnings count as errors".to_string();
                    report(format!("nvrtc compute_{major}{minor}"), detail, &log);
                }
                ptx
            }
            Err((status, log)) => {
                let options = options_for(major, minor, &tools.include_dir).join(" ");
                let detail = format!("failed: {status}; options: {options}");
                report(format!("nvrtc compute_{major}{minor}"), detail, &log);
                continue;
            }
        };
        kernels = count_kernels(&ptx);
        let ptx_path = out_dir.join(format!("{stem}.compute_{major}{minor}.ptx"));
        let cubin_path = out_dir.join(format!("{stem}.{arch}.cubin"));
        std::fs::write(&ptx_path, &ptx)
            .map_err(|e| format!("cannot write {}: {e}", ptx_path.display()))?;
        let output = Command::new(&tools.ptxas)
            .arg(format!("-arch={arch}"))
            .arg(&ptx_path)
            .arg("-o")
            .arg(&cubin_path)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", tools.ptxas.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if !output.status.success() {
            let detail = format!("failed ({}) on {}", output.status, ptx_path.display());
            report(format!("ptxas -arch={arch}"), detail, &text);
        } else if !text.trim().is_empty() {
            let detail = "warned; warnings count as errors".to_string();
            report(format!("ptxas -arch={arch}"), detail, &text);
        }
    }
    if errors.is_empty() {
        return Ok(kernels);
    }
    let text: Vec<String> = errors
        .into_iter()
        .map(|(label, detail, body)| match body.is_empty() {
            true => format!("{label} {detail}"),
            false => format!("{label} {detail}:\n{body}"),
        })
        .collect();
    Err(text.join("\n"))
}

/// The NVRTC options for one arch: [`kiln_device::nvrtc_options`] plus the header folder.
pub fn options_for(major: u32, minor: u32, include_dir: &Path) -> Vec<String> {
    let mut options = kiln_device::nvrtc_options(major, minor);
    options.push(format!("--include-path={}", include_dir.display()));
    options
}

/// Compiles `source` to PTX; `Ok((ptx, log))` or `Err((what failed, log))`. Uses cudarc's thin `result` layer
/// rather than its safe `compile_ptx_with_opts`, because only the former returns the log
/// (warnings) of a successful compile.
fn compile_ptx(
    source: &str,
    name: &str,
    major: u32,
    minor: u32,
    tools: &CudaTools,
) -> Result<(String, String), (String, String)> {
    use cudarc::nvrtc::result;
    let options = options_for(major, minor, &tools.include_dir);
    let nul = |what: &str| (format!("the {what} contains a NUL byte"), String::new());
    let source = CString::new(source).map_err(|_| nul("file"))?;
    let name = CString::new(name).map_err(|_| nul("path"))?;
    let program = result::create_program(&source, Some(&name))
        .map_err(|e| (format!("nvrtcCreateProgram: {e:?}"), String::new()))?;
    // SAFETY: `program` was created above and is destroyed exactly once, below.
    let compiled = unsafe { result::compile_program(program, &options) };
    // SAFETY: as above; the log exists whether or not compilation succeeded.
    let log = unsafe { result::get_program_log(program) }
        .map(|chars| c_chars_to_string(&chars))
        .unwrap_or_else(|e| format!("(no log: {e:?})"));
    let ptx = match compiled {
        // SAFETY: as above, after a successful compile.
        Ok(()) => unsafe { result::get_ptx(program) }
            .map(|chars| c_chars_to_string(&chars))
            .map_err(|e| (format!("nvrtcGetPTX: {e:?}"), log.clone())),
        Err(e) => Err((format!("{e:?}"), log.clone())),
    };
    // SAFETY: as above.
    let _ = unsafe { result::destroy_program(program) };
    ptx.map(|ptx| (ptx, log))
}

/// A NUL-terminated C character buffer as a Rust string.
fn c_chars_to_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Number of kernel entry points (`.entry` directives) in a PTX text.
pub fn count_kernels(ptx: &str) -> usize {
    ptx.lines()
        .filter(|line| {
            let line = line.trim_start();
            line.starts_with(".entry ")
                || line.starts_with(".visible .entry ")
                || line.starts_with(".weak .entry ")
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_entries_not_functions() {
        let ptx = "\
.version 9.0
.target sm_90
.func helper(.param .b32 x) {}
.visible .entry fill_f32(
\t.param .u64 out
)
{ ret; }
.visible .entry fill_f16(
)
{ ret; }
.weak .entry templated_kernel(
)
";
        assert_eq!(count_kernels(ptx), 3);
        assert_eq!(count_kernels(".func only() {}"), 0);
    }

    #[test]
    fn options_are_the_runtime_options_plus_include_path() {
        let options = options_for(9, 0, Path::new("/opt/cuda/include"));
        let runtime = kiln_device::nvrtc_options(9, 0);
        assert_eq!(&options[..runtime.len()], &runtime[..]);
        assert_eq!(
            options[runtime.len()..],
            ["--include-path=/opt/cuda/include".to_string()]
        );
        assert_eq!(options[0], "--gpu-architecture=compute_90");
    }

    #[test]
    fn walks_sources_and_skips_target_and_hidden() {
        let root = std::env::temp_dir().join(format!("kiln-xtask-walk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for path in [
            "device/src/ops/fill/fill.cu",
            "device/src/ops/copy/copy.cu",
            "device/src/ops/copy/copy.rs",
            "device/target/debug/stale.cu",
            "device/.hidden/x.cu",
            "device/src/not_cuda.cuh",
        ] {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"").unwrap();
        }
        let found: Vec<String> = find_cu_files(&root)
            .unwrap()
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        assert_eq!(
            found,
            ["device/src/ops/copy/copy.cu", "device/src/ops/fill/fill.cu"]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
