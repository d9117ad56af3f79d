//! `cargo xtask emu [--devices N] [--memory BYTES] [--cc X.Y] [--delay] -- CMD...`: runs CMD
//! with kiln's CUDA emulator (crate `kiln-cuda-emu`) loaded in place of NVIDIA's libraries.
//!
//! Steps: builds `kiln-cuda-emu` ([`PROFILE`] profile: the emulator runs every kernel, copy and
//! GEMM of a test, so its own speed is CI time); makes `target/cuda-emu/lib/` hold the names
//! cudarc dlopens ([`LIBRARY_NAMES`]) as symlinks to the one built `libkiln_cuda_emu.so`, and
//! `target/cuda-emu/include` a link to the emulator's CUDA headers; runs CMD with that folder
//! first on `LD_LIBRARY_PATH`, the `KILN_EMU_*` variables of the flags, `KILN_EMULATED=1` (tests
//! may scale big shapes down under emulation, never skip), `KILN_CUDA_INCLUDE` and (unless set)
//! `KILN_KERNEL_CACHE=target/cuda-emu/kiln-kernel-cache`, since the emulator's compiled images
//! must never meet real PTX in kiln's disk cache; exits with CMD's status.
//!
//! Invariants: the emulator's folder is always the first `LD_LIBRARY_PATH` entry, so a bare-name
//! dlopen of any of [`LIBRARY_NAMES`] resolves to the emulator even where a real driver is
//! installed (and such a driver is reported, never silently used); the links are rewritten on
//! every run, so they never point at a stale build.

pub mod args;
pub mod build;
pub mod mutants;
pub mod probe;
pub mod runner;
pub mod suite;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use args::EmuOptions;

/// The cargo profile the emulator is built with.
pub const PROFILE: &str = "release";

/// Every name under which cudarc looks for a library the emulator stands in for.
pub const LIBRARY_NAMES: [&str; 8] = [
    "libcuda.so",
    "libcuda.so.1",
    "libnvrtc.so",
    "libnvrtc.so.13",
    "libcublas.so",
    "libcublas.so.13",
    "libnccl.so",
    "libnccl.so.2",
];

/// The built emulator, ready to run commands under.
#[derive(Debug, Clone)]
pub struct Emulator {
    /// `target/cuda-emu/lib`: the links of [`LIBRARY_NAMES`].
    pub lib_dir: PathBuf,
    /// Variables every command gets (besides `LD_LIBRARY_PATH`).
    pub vars: Vec<(String, String)>,
}

/// Runs `cargo xtask emu`; the result is CMD's exit status.
pub fn run(args: &[String]) -> Result<i32, String> {
    if matches!(args.first().map(String::as_str), Some("-h" | "--help")) {
        println!("usage: cargo xtask emu {}", args::FLAGS_USAGE);
        return Ok(0);
    }
    let options = args::parse(args)
        .map_err(|e| format!("emu: {e}\nusage: cargo xtask emu {}", args::FLAGS_USAGE))?;
    let emulator = Emulator::build(&options)?;
    let (program, rest) = options
        .command
        .split_first()
        .ok_or("emu: no command to run")?;
    let status = emulator
        .command(program)
        .args(rest)
        .status()
        .map_err(|e| format!("emu: cannot run `{program}`: {e}"))?;
    Ok(exit_code(status))
}

/// The exit code a shell would report for `status` (128 + signal for a killed process).
pub fn exit_code(status: ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    1
}

impl Emulator {
    /// Builds the emulator and lays out `target/cuda-emu/` for `options`.
    pub fn build(options: &EmuOptions) -> Result<Emulator, String> {
        let root = crate::paths::workspace_root();
        let target = crate::paths::target_dir(&root);
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cargo
            .current_dir(&root)
            .args(["build", "--quiet", "-p", "kiln-cuda-emu"]);
        if PROFILE == "release" {
            cargo.arg("--release");
        }
        // When this xtask is itself a release build (`cargo xtask`), it joins the build with
        // its own features: the emulator's dependencies (half, gemm, cudarc, ...) then get
        // xtask's feature set, a superset of the emulator's, and the artifacts xtask's build
        // already made are reused (xtask itself is up to date). Built alone, those crates
        // compiled again with fewer features: about a minute of CI on 2 cores.
        if PROFILE == "release" && !cfg!(debug_assertions) {
            cargo.args(["-p", "xtask"]);
            if cfg!(feature = "mpi") {
                cargo.args(["--features", "xtask/mpi"]);
            }
        }
        let status = cargo
            .status()
            .map_err(|e| format!("emu: cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!(
                "emu: `cargo build -p kiln-cuda-emu` failed ({status})"
            ));
        }
        let profile_dir = if PROFILE == "release" {
            "release"
        } else {
            "debug"
        };
        let built = target.join(profile_dir).join("libkiln_cuda_emu.so");
        if !built.is_file() {
            return Err(format!(
                "emu: cargo built kiln-cuda-emu but {} is missing (is the crate still a cdylib?)",
                built.display()
            ));
        }
        let emu_dir = target.join("cuda-emu");
        let lib_dir = emu_dir.join("lib");
        link_libraries(&lib_dir, &built)?;
        let include_dir = link_headers(&emu_dir, &root.join("crates/cuda-emu/include"))?;
        report_other_drivers(&lib_dir);

        let mut vars: Vec<(String, String)> = options
            .env_vars()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        vars.push(("KILN_EMULATED".into(), "1".into()));
        // kiln's on-disk kernel cache keys on the NVRTC version, which the emulator shares with
        // NVIDIA's: keep its images apart from real PTX (unless the caller chose a folder).
        if std::env::var_os("KILN_KERNEL_CACHE").is_none() {
            let cache = emu_dir.join("kiln-kernel-cache");
            vars.push(("KILN_KERNEL_CACHE".into(), cache.display().to_string()));
        }
        if let Some(dir) = &include_dir {
            vars.push(("KILN_CUDA_INCLUDE".into(), dir.display().to_string()));
        }
        Ok(Emulator { lib_dir, vars })
    }

    /// `LD_LIBRARY_PATH` with the emulator's folder first.
    pub fn library_path(&self) -> OsString {
        prepend_path(&self.lib_dir, std::env::var_os("LD_LIBRARY_PATH"))
    }

    /// A command for `program` that runs under the emulator.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command.env("LD_LIBRARY_PATH", self.library_path());
        for (key, value) in &self.vars {
            command.env(key, value);
        }
        command
    }
}

/// `dir` followed by the entries of `existing` (empty entries dropped: an empty entry means the
/// current folder to the dynamic loader).
pub fn prepend_path(dir: &Path, existing: Option<OsString>) -> OsString {
    let mut entries = vec![dir.to_path_buf()];
    if let Some(existing) = existing {
        entries.extend(std::env::split_paths(&existing).filter(|p| !p.as_os_str().is_empty()));
    }
    std::env::join_paths(entries).unwrap_or_else(|_| dir.as_os_str().to_owned())
}

/// Makes `lib_dir` hold every name of [`LIBRARY_NAMES`] as a symlink to `built`.
fn link_libraries(lib_dir: &Path, built: &Path) -> Result<(), String> {
    std::fs::create_dir_all(lib_dir)
        .map_err(|e| format!("emu: cannot create {}: {e}", lib_dir.display()))?;
    for name in LIBRARY_NAMES {
        let link = lib_dir.join(name);
        replace_link(built, &link)?;
    }
    Ok(())
}

/// Links `<emu_dir>/include` to `headers` when the emulator ships headers.
fn link_headers(emu_dir: &Path, headers: &Path) -> Result<Option<PathBuf>, String> {
    let link = emu_dir.join("include");
    if !headers.join("cuda_fp16.h").is_file() {
        let _ = std::fs::remove_file(&link);
        return Ok(None);
    }
    replace_link(headers, &link)?;
    Ok(Some(link))
}

fn replace_link(target: &Path, link: &Path) -> Result<(), String> {
    if std::fs::symlink_metadata(link).is_ok() {
        std::fs::remove_file(link)
            .map_err(|e| format!("emu: cannot replace {}: {e}", link.display()))?;
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(target, link).map_err(|e| {
            format!(
                "emu: cannot link {} -> {}: {e}",
                link.display(),
                target.display()
            )
        })
    }
    #[cfg(not(unix))]
    {
        let _ = target;
        Err("emu: the CUDA emulator runs on Linux only".to_string())
    }
}

/// Prints where else a `libcuda` is installed (ldconfig's cache, other `LD_LIBRARY_PATH`
/// folders): the emulator still wins, being first, but a run should say a real driver exists.
fn report_other_drivers(lib_dir: &Path) {
    let mut found: Vec<String> = Vec::new();
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        for dir in std::env::split_paths(&paths) {
            if dir != lib_dir && dir.join("libcuda.so.1").exists() {
                found.push(dir.join("libcuda.so.1").display().to_string());
            }
        }
    }
    if let Ok(out) = Command::new("ldconfig").arg("-p").output() {
        found.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|line| line.trim_start().starts_with("libcuda.so"))
                .map(|line| line.trim().to_string()),
        );
    }
    if !found.is_empty() {
        eprintln!(
            "xtask emu: note: another libcuda is installed ({}); the emulator's {} comes first \
             on LD_LIBRARY_PATH, so it is the one loaded",
            found.join("; "),
            lib_dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulator_folder_comes_first_and_empty_entries_go() {
        let got = prepend_path(
            Path::new("/t/cuda-emu/lib"),
            Some(OsString::from("/usr/lib::/opt/x")),
        );
        assert_eq!(got, OsString::from("/t/cuda-emu/lib:/usr/lib:/opt/x"));
        assert_eq!(
            prepend_path(Path::new("/t/lib"), None),
            OsString::from("/t/lib")
        );
    }

    #[test]
    fn links_cover_every_name_cudarc_loads_and_are_replaced() {
        let root = std::env::temp_dir().join(format!("xtask-emu-links-{}", std::process::id()));
        let lib = root.join("lib");
        let (old, new) = (root.join("old.so"), root.join("new.so"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(&old, "old").unwrap();
        std::fs::write(&new, "new").unwrap();
        link_libraries(&lib, &old).unwrap();
        link_libraries(&lib, &new).unwrap();
        for name in LIBRARY_NAMES {
            assert_eq!(std::fs::read_link(lib.join(name)).unwrap(), new, "{name}");
        }
        for wanted in [
            "libcuda.so.1",
            "libnvrtc.so.13",
            "libcublas.so.13",
            "libnccl.so.2",
        ] {
            assert!(LIBRARY_NAMES.contains(&wanted));
        }
        // No headers: no include link, and a stale one is removed.
        assert_eq!(link_headers(&root, &root.join("none")).unwrap(), None);
        std::fs::create_dir_all(root.join("hdr")).unwrap();
        std::fs::write(root.join("hdr/cuda_fp16.h"), "").unwrap();
        let link = link_headers(&root, &root.join("hdr")).unwrap().unwrap();
        assert!(link.join("cuda_fp16.h").is_file());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
