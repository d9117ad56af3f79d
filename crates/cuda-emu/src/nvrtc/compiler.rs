//! Compiles one program with the host C++ compiler into a shared object, cached on disk by
//! content.
//!
//! Invariants:
//! - The module cache (`$KILN_EMU_CACHE`, else `~/.cache/kiln/cuda-emu`) holds `modules/<hash>.so`
//!   and `include-<hash>/` (the emulator's headers); a file appears there only by an atomic
//!   rename of a finished file, so concurrent processes never see half of one.
//! - The hash covers everything the object depends on: the emulator's headers, the compiler and
//!   its flags, the options, the named headers, the program's name and source.
//! - The emulator's include folder comes first on the include path, so `<cuda_fp16.h>` is the
//!   emulator's, never NVIDIA's; then the program's named headers; then `--include-path`s.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::nvrtc::sys::nvrtcResult;

use super::options::{self, HostOptions};
use super::scan;

/// The headers kernels are compiled against: include name and text.
pub const EMULATOR_HEADERS: &[(&str, &str)] = &[
    (
        "kiln_emu_runtime.h",
        include_str!("../../include/kiln_emu_runtime.h"),
    ),
    (
        "kiln_emu_fiber.h",
        include_str!("../../include/kiln_emu_fiber.h"),
    ),
    (
        "kiln_emu_warp.h",
        include_str!("../../include/kiln_emu_warp.h"),
    ),
    (
        "kiln_emu_builtins.h",
        include_str!("../../include/kiln_emu_builtins.h"),
    ),
    (
        "kiln_emu_vector_types.h",
        include_str!("../../include/kiln_emu_vector_types.h"),
    ),
    (
        "kiln_emu_atomics.h",
        include_str!("../../include/kiln_emu_atomics.h"),
    ),
    (
        "kiln_emu_float16.h",
        include_str!("../../include/kiln_emu_float16.h"),
    ),
    ("cuda_fp16.h", include_str!("../../include/cuda_fp16.h")),
    ("cuda_bf16.h", include_str!("../../include/cuda_bf16.h")),
];

/// g++ flags every module is built with (see kiln_emu_builtins.h for the floating-point ones);
/// the optimisation level comes from `KILN_EMU_OPT` ([`opt_level`]).
const CXX_FLAGS: &[&str] = &[
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-pthread",
];

/// One program to compile.
pub struct Program<'a> {
    /// The program's name (diagnostics name it).
    pub name: &'a str,
    /// Its source.
    pub source: &'a str,
    /// NVRTC options.
    pub options: &'a [String],
    /// Named headers: include name and text.
    pub headers: &'a [(String, String)],
}

/// A compiled program.
#[derive(Debug, Clone)]
pub struct Built {
    /// The content hash.
    pub hash: String,
    /// The shared object in the cache.
    pub library: PathBuf,
    /// The compiler's diagnostics (empty from the cache).
    pub log: String,
    /// The `extern "C"` kernels the module defines, in source order.
    pub kernels: Vec<String>,
}

/// Why a program did not compile: NVRTC's status and the log.
#[derive(Debug, Clone)]
pub struct BuildFailure {
    /// `NVRTC_ERROR_INVALID_OPTION`, `NVRTC_ERROR_COMPILATION` or `NVRTC_ERROR_INTERNAL_ERROR`.
    pub code: nvrtcResult,
    /// What went wrong, as NVRTC's program log.
    pub log: String,
}

fn internal(log: String) -> BuildFailure {
    BuildFailure {
        code: nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR,
        log,
    }
}

/// The module cache folder.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KILN_EMU_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    Path::new(&home).join(".cache/kiln/cuda-emu")
}

/// `KILN_EMU_OPT` (`-O0` to `-O3`, default `-O1`: kiln's largest kernel file compiles in about
/// two thirds of -O2's time, and the emulator proves logic, not speed).
fn opt_level() -> String {
    match std::env::var("KILN_EMU_OPT").as_deref() {
        Ok(o @ ("-O0" | "-O1" | "-O2" | "-O3")) => o.to_string(),
        _ => "-O1".into(),
    }
}

/// The compiler as a command: `$CXX` may carry words (`ccache g++`, `g++ -m64`).
fn compiler_command() -> Command {
    let cxx = compiler();
    let mut words = cxx.split_whitespace();
    let mut cmd = Command::new(words.next().unwrap_or("g++"));
    cmd.args(words);
    cmd
}

fn compiler() -> String {
    std::env::var("CXX")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "g++".into())
}

/// A 128-bit content hash (two FNV-1a lanes), as hex; inputs are length-prefixed so that
/// different splits of the same bytes differ.
struct Hasher([u64; 2]);

impl Hasher {
    fn new() -> Self {
        Hasher([0xcbf2_9ce4_8422_2325, 0x6c62_272e_07bb_0142])
    }
    fn bytes(&mut self, data: &[u8]) {
        for (lane, prime) in self.0.iter_mut().zip([0x100_0000_01b3u64, 0x100_0000_01b5]) {
            for &b in (data.len() as u64).to_le_bytes().iter().chain(data) {
                *lane ^= b as u64;
                *lane = lane.wrapping_mul(prime);
            }
        }
    }
    fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.0[0], self.0[1])
    }
}

fn headers_hash() -> String {
    let mut h = Hasher::new();
    for (name, text) in EMULATOR_HEADERS {
        h.bytes(name.as_bytes());
        h.bytes(text.as_bytes());
    }
    h.hex()
}

/// The program's content hash (see the file comment).
pub fn program_hash(p: &Program) -> String {
    let mut h = Hasher::new();
    h.bytes(env!("CARGO_PKG_VERSION").as_bytes());
    h.bytes(headers_hash().as_bytes());
    h.bytes(compiler().as_bytes());
    for f in CXX_FLAGS {
        h.bytes(f.as_bytes());
    }
    h.bytes(opt_level().as_bytes());
    for o in p.options {
        h.bytes(o.as_bytes());
    }
    for (name, text) in p.headers {
        h.bytes(name.as_bytes());
        h.bytes(text.as_bytes());
    }
    h.bytes(p.name.as_bytes());
    h.bytes(p.source.as_bytes());
    h.hex()
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// A name no other thread or process is using, for a file about to be renamed into place.
fn unique_suffix() -> String {
    format!(
        "tmp-{}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(unique_suffix());
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}

/// The folder holding the emulator's headers (written on first use).
fn emulator_include_dir(cache: &Path) -> Result<PathBuf, BuildFailure> {
    let dir = cache.join(format!("include-{}", headers_hash()));
    if EMULATOR_HEADERS.iter().all(|(n, _)| dir.join(n).is_file()) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| internal(format!("cannot create {}: {e}", dir.display())))?;
    for (name, text) in EMULATOR_HEADERS {
        write_atomically(&dir.join(name), text.as_bytes())
            .map_err(|e| internal(format!("cannot write {name} in {}: {e}", dir.display())))?;
    }
    Ok(dir)
}

/// The compiler arguments shared by the scan and the build.
fn common_args(host: &HostOptions, emu_include: &Path, work: &Path) -> Vec<String> {
    let mut args = vec![
        "-x".to_string(),
        "c++".into(),
        format!("-std={}", host.std),
        format!("-D__CUDA_ARCH__={}", host.cuda_arch),
    ];
    args.extend(host.macros.iter().cloned());
    args.push(format!("-I{}", emu_include.display()));
    args.push(format!("-I{}", work.display()));
    args.extend(host.include_paths.iter().map(|p| format!("-I{p}")));
    args.push("-include".into());
    args.push("kiln_emu_runtime.h".into());
    for pre in &host.pre_includes {
        args.push("-include".into());
        args.push(pre.clone());
    }
    args
}

fn run(cmd: &mut Command, work: &Path) -> Result<(bool, String), BuildFailure> {
    let out = cmd.output().map_err(|e| {
        internal(format!(
            "cannot run the host C++ compiler `{}` (set CXX): {e}",
            compiler()
        ))
    })?;
    let log = String::from_utf8_lossy(&out.stderr).replace(&format!("{}/", work.display()), "");
    Ok((out.status.success(), log))
}

/// Compiles `p` (or finds it in the cache).
pub fn build(p: &Program) -> Result<Built, BuildFailure> {
    let host = options::parse(p.options).map_err(|e| BuildFailure {
        code: nvrtcResult::NVRTC_ERROR_INVALID_OPTION,
        log: e.0 + "\n",
    })?;
    let hash = program_hash(p);
    let cache = cache_dir();
    let modules = cache.join("modules");
    let library = modules.join(format!("{hash}.so"));
    // The kernel list is written before the object is renamed into place, so an object in the
    // cache always has one.
    let entries = library.with_extension("kernels");
    if library.is_file() {
        if let Ok(list) = std::fs::read_to_string(&entries) {
            return Ok(Built {
                hash,
                library,
                log: String::new(),
                kernels: list.lines().map(str::to_string).collect(),
            });
        }
    }
    let emu_include = emulator_include_dir(&cache)?;
    let work = cache
        .join("work")
        .join(format!("{hash}-{}", unique_suffix()));
    std::fs::create_dir_all(&work)
        .and_then(|_| std::fs::create_dir_all(&modules))
        .map_err(|e| internal(format!("cannot create {}: {e}", work.display())))?;
    let result = build_in(p, &host, &emu_include, &work, &library);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|(log, kernels)| Built {
        hash,
        library,
        log,
        kernels,
    })
}

fn build_in(
    p: &Program,
    host: &HostOptions,
    emu_include: &Path,
    work: &Path,
    library: &Path,
) -> Result<(String, Vec<String>), BuildFailure> {
    let io = |e: std::io::Error| internal(format!("cannot write in {}: {e}", work.display()));
    for (name, text) in p.headers {
        let path = work.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&path, text).map_err(io)?;
    }
    let name = p.name.replace(['"', '\\', '\n'], "_");
    std::fs::write(
        work.join("program.cu"),
        format!("#line 1 \"{name}\"\n{}\n", p.source),
    )
    .map_err(io)?;
    let compile_error = |log: String| BuildFailure {
        code: nvrtcResult::NVRTC_ERROR_COMPILATION,
        log,
    };
    let common = common_args(host, emu_include, work);
    let (ok, log) = run(
        compiler_command()
            .args(&common)
            .args(["-E", "-DKILN_EMU_SCAN", "-o"])
            .arg(work.join("program.ii"))
            .arg(work.join("program.cu")),
        work,
    )?;
    if !ok {
        return Err(compile_error(log));
    }
    let preprocessed = std::fs::read_to_string(work.join("program.ii"))
        .map_err(|e| internal(format!("cannot read the preprocessed program: {e}")))?;
    let found = scan::scan(&preprocessed);
    std::fs::write(
        work.join("unit.cu"),
        format!(
            "#include \"program.cu\"\n#line 1 \"<kiln-cuda-emu entry points>\"\n{}",
            scan::entry_points(&found)
        ),
    )
    .map_err(io)?;
    let tmp = library.with_extension(unique_suffix());
    let (ok, log) = run(
        compiler_command()
            .args(&common)
            .args(CXX_FLAGS)
            .arg(opt_level())
            .arg(work.join("unit.cu"))
            .arg("-o")
            .arg(&tmp)
            .arg("-ldl"),
        work,
    )?;
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        return Err(compile_error(log));
    }
    let kernels: Vec<String> = found.kernels.iter().map(|k| k.name.clone()).collect();
    let list: String = kernels.iter().map(|k| format!("{k}\n")).collect();
    write_atomically(&library.with_extension("kernels"), list.as_bytes()).map_err(io)?;
    std::fs::rename(&tmp, library)
        .map_err(|e| internal(format!("cannot move {} into place: {e}", tmp.display())))?;
    Ok((log, kernels))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_header_in_include_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
        for entry in std::fs::read_dir(dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            assert!(
                super::EMULATOR_HEADERS.iter().any(|(n, _)| *n == name),
                "include/{name} is not in EMULATOR_HEADERS"
            );
        }
    }
}
