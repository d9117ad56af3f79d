//! Finding (or installing) the CUDA 13.0 compiler tools that `cargo xtask kernels` needs.
//!
//! CI machines have no CUDA toolkit and no GPU, but NVIDIA publishes the pieces we need as
//! ordinary PyPI wheels, so a fresh machine with Python and pip can get them in seconds:
//!
//! | wheel | what we use from it |
//! |---|---|
//! | `nvidia-cuda-nvrtc==13.0.*` | `libnvrtc.so.13` + `libnvrtc-builtins.so.13.0` (the compiler the runtime uses) |
//! | `nvidia-cuda-nvcc==13.0.*` | `ptxas` (assembles PTX to SASS: catches what NVRTC lets through) |
//! | `nvidia-cuda-runtime==13.0.*` | `include/cuda_fp16.h`, `cuda_bf16.h` (NVRTC 13.0 does not ship them built in) |
//!
//! They are installed with `python3 -m pip install --no-deps --target <cache>` so that pip
//! cannot pull in a newer minor version of a dependency (the nvcc wheel declares unpinned
//! dependencies on `nvidia-cuda-runtime`, `nvidia-nvvm` and `nvidia-cuda-crt`; we need only the
//! runtime headers, which we pin ourselves).
//!
//! The cache lives outside the repository: `$KILN_CUDA_TOOLS` when set, otherwise
//! `$XDG_CACHE_HOME/kiln/cuda-13.0` or `~/.cache/kiln/cuda-13.0`. An install goes to a sibling
//! `*.partial-<pid>` folder first and is renamed into place only once it is complete, so an
//! interrupted install is never mistaken for a good one. A cache (or a CUDA toolkit that
//! `$KILN_CUDA_TOOLS` points at) is used as-is when it holds the three things we need.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pip requirements installed into the cache, pinned to CUDA 13.0 (cudarc's `cuda-13000`).
pub const WHEELS: [&str; 3] = [
    "nvidia-cuda-nvrtc==13.0.*",
    "nvidia-cuda-nvcc==13.0.*",
    "nvidia-cuda-runtime==13.0.*",
];

/// Where the tools were found.
#[derive(Debug, Clone)]
pub struct CudaTools {
    /// Folder holding `libnvrtc.so.13` and `libnvrtc-builtins.so.13.0`.
    pub lib_dir: PathBuf,
    /// The `ptxas` executable.
    pub ptxas: PathBuf,
    /// Folder holding `cuda_fp16.h` and `cuda_bf16.h`.
    pub include_dir: PathBuf,
}

/// The cache folder: `$KILN_CUDA_TOOLS`, else `$XDG_CACHE_HOME/kiln/cuda-13.0`, else
/// `$HOME/.cache/kiln/cuda-13.0`.
pub fn cache_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("KILN_CUDA_TOOLS").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(xdg) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(xdg).join("kiln").join("cuda-13.0"));
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/kiln/cuda-13.0")),
        None => Err(
            "neither KILN_CUDA_TOOLS nor HOME is set: set KILN_CUDA_TOOLS to a folder \
                     where the CUDA 13.0 NVRTC/ptxas wheels may be installed"
                .to_string(),
        ),
    }
}

/// Looks for the tools under `root`, in the pip-wheel layout (`nvidia/cu13/{lib,bin,include}`)
/// or a CUDA toolkit's layout (`{lib64,lib}/`, `bin/`, `include/`).
pub fn find_in(root: &Path) -> Option<CudaTools> {
    let layouts = [
        (
            root.join("nvidia/cu13/lib"),
            root.join("nvidia/cu13/bin"),
            root.join("nvidia/cu13/include"),
        ),
        (root.join("lib64"), root.join("bin"), root.join("include")),
        (root.join("lib"), root.join("bin"), root.join("include")),
    ];
    layouts
        .into_iter()
        .find_map(|(lib_dir, bin_dir, include_dir)| {
            let complete = lib_dir.join("libnvrtc.so.13").is_file()
                && bin_dir.join("ptxas").is_file()
                && include_dir.join("cuda_fp16.h").is_file()
                && include_dir.join("cuda_bf16.h").is_file();
            complete.then(|| CudaTools {
                lib_dir,
                ptxas: bin_dir.join("ptxas"),
                include_dir,
            })
        })
}

/// Returns the tools from the cache, installing the wheels first when the cache lacks them.
pub fn find_or_install() -> Result<CudaTools, String> {
    let cache = cache_dir()?;
    if let Some(tools) = find_in(&cache) {
        return Ok(tools);
    }
    let non_empty = std::fs::read_dir(&cache).is_ok_and(|mut entries| entries.next().is_some());
    if non_empty && std::env::var_os("KILN_CUDA_TOOLS").is_some() {
        return Err(format!(
            "KILN_CUDA_TOOLS={} exists but lacks libnvrtc.so.13, bin/ptxas or include/cuda_fp16.h \
             (pip layout nvidia/cu13/... or toolkit layout lib64/, bin/, include/): point it at a \
             CUDA 13.0 toolkit, or at an empty/absent folder to have the wheels installed there",
            cache.display()
        ));
    }
    install(&cache)?;
    find_in(&cache).ok_or_else(|| {
        format!(
            "installed {} into {} but did not find libnvrtc.so.13, ptxas and cuda_fp16.h in it; \
             the wheels' layout may have changed: look inside and adjust xtask/src/cuda_tools.rs",
            WHEELS.join(" "),
            cache.display()
        )
    })
}

/// Installs [`WHEELS`] into `cache` through a temporary sibling folder.
fn install(cache: &Path) -> Result<(), String> {
    let parent = cache.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let name = cache.file_name().map(|n| n.to_string_lossy().into_owned());
    let partial = parent.join(format!(
        "{}.partial-{}",
        name.as_deref().unwrap_or("cuda-tools"),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&partial);
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    eprintln!(
        "xtask: installing {} into {} (one-time, about 150 MB) ...",
        WHEELS.join(" "),
        cache.display()
    );
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--no-deps",
            "--target",
        ])
        .arg(&partial)
        .args(WHEELS)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .status()
        .map_err(|e| {
            format!("cannot run `{python} -m pip`: {e}; install Python 3 with pip (or set PYTHON)")
        })?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(format!(
            "`{python} -m pip install --target {} {}` failed ({status}); check network access to \
             PyPI, or set KILN_CUDA_TOOLS to an existing CUDA 13.0 toolkit",
            partial.display(),
            WHEELS.join(" ")
        ));
    }
    // An empty folder (e.g. a fresh `KILN_CUDA_TOOLS`) is replaced; rename(2) does that too, but
    // only on Linux, so remove it first.
    let _ = std::fs::remove_dir(cache);
    match std::fs::rename(&partial, cache) {
        Ok(()) => Ok(()),
        // Another xtask finished the same install first: keep its copy.
        Err(_) if find_in(cache).is_some() => {
            let _ = std::fs::remove_dir_all(&partial);
            Ok(())
        }
        Err(e) => Err(format!(
            "cannot move {} to {}: {e}; remove {} and retry",
            partial.display(),
            cache.display(),
            cache.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    #[test]
    fn finds_pip_layout_only_when_complete() {
        let root = std::env::temp_dir().join(format!("kiln-xtask-tools-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        touch(&root.join("nvidia/cu13/lib/libnvrtc.so.13"));
        touch(&root.join("nvidia/cu13/bin/ptxas"));
        touch(&root.join("nvidia/cu13/include/cuda_fp16.h"));
        assert!(find_in(&root).is_none(), "cuda_bf16.h is missing");
        touch(&root.join("nvidia/cu13/include/cuda_bf16.h"));
        let tools = find_in(&root).expect("complete pip layout");
        assert_eq!(tools.lib_dir, root.join("nvidia/cu13/lib"));
        assert_eq!(tools.ptxas, root.join("nvidia/cu13/bin/ptxas"));
        assert_eq!(tools.include_dir, root.join("nvidia/cu13/include"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn finds_toolkit_layout() {
        let root = std::env::temp_dir().join(format!("kiln-xtask-toolkit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        touch(&root.join("lib64/libnvrtc.so.13"));
        touch(&root.join("bin/ptxas"));
        touch(&root.join("include/cuda_fp16.h"));
        touch(&root.join("include/cuda_bf16.h"));
        let tools = find_in(&root).expect("complete toolkit layout");
        assert_eq!(tools.lib_dir, root.join("lib64"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
