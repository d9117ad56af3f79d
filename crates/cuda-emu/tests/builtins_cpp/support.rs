//! What the builtins tests share: the host C++ compiler, the emulator's header folder, and the
//! probe program (`probe.cpp`) compiled once per test binary and run on byte streams.
//!
//! Invariants: the probe is compiled with the flags the emulator's NVRTC uses for kernels
//! (`-std=c++17 -O2 -ffp-contract=off -fno-strict-aliasing`), against `include/` only; a
//! compiler failure fails the test with the compiler's log (the emulator cannot work without
//! one, so there is nothing to skip).

#![allow(dead_code)] // each test binary uses part of it

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The C++ compiler: `$CXX`, else `g++`.
pub fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".to_string())
}

/// `crates/cuda-emu`.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The emulator's CUDA headers.
pub fn include_dir() -> PathBuf {
    crate_dir().join("include")
}

/// The g++ flags kernels are compiled with.
pub const FLAGS: [&str; 4] = [
    "-std=c++17",
    "-O2",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
];

/// Runs a compiler command and panics with its log when it fails.
pub fn compile(args: &[&std::ffi::OsStr], what: &str) {
    let out = Command::new(cxx())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {}: {e}", cxx()));
    assert!(
        out.status.success(),
        "{what} does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The probe binary, compiled on first use. Test binaries share it: it is named by a hash of
/// its source, the headers and the flags, and moved into place only once complete.
pub fn probe() -> &'static Path {
    static PROBE: OnceLock<PathBuf> = OnceLock::new();
    PROBE.get_or_init(|| {
        let src = crate_dir().join("tests/builtins_cpp/probe.cpp");
        let mut hasher = DefaultHasher::new();
        FLAGS.hash(&mut hasher);
        std::fs::read(&src).expect("probe source").hash(&mut hasher);
        let mut headers: Vec<PathBuf> = std::fs::read_dir(include_dir())
            .expect("include dir")
            .map(|e| e.expect("entry").path())
            .collect();
        headers.sort();
        for h in &headers {
            std::fs::read(h).expect("header").hash(&mut hasher);
        }
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-emu-builtins");
        std::fs::create_dir_all(&dir).expect("temp dir");
        let exe = dir.join(format!("probe-{:016x}", hasher.finish()));
        if exe.exists() {
            return exe;
        }
        let partial = dir.join(format!("probe-partial-{}", std::process::id()));
        let inc = format!("-I{}", include_dir().display());
        let mut args: Vec<&std::ffi::OsStr> = FLAGS.iter().map(|f| f.as_ref()).collect();
        args.extend([
            "-Wall".as_ref(),
            "-Wextra".as_ref(),
            "-Werror".as_ref(),
            "-pthread".as_ref(),
            inc.as_ref(),
            src.as_os_str(),
            "-o".as_ref(),
            partial.as_os_str(),
        ]);
        compile(&args, "tests/builtins_cpp/probe.cpp");
        std::fs::rename(&partial, &exe).expect("probe moved into place");
        exe
    })
}

/// Runs `probe op` with `input` on stdin; returns its stdout.
pub fn run(op: &str, input: &[u8]) -> Vec<u8> {
    let (ok, out) = run_program(probe(), op, input);
    assert!(ok, "probe {op} failed:\n{}", String::from_utf8_lossy(&out));
    out
}

/// Runs `program arg` with `input` on stdin; returns whether it exited 0, and its stdout.
pub fn run_program(program: &Path, arg: &str, input: &[u8]) -> (bool, Vec<u8>) {
    let mut child = Command::new(program)
        .arg(arg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("probe runs");
    let mut stdin = child.stdin.take().expect("stdin");
    let data = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().expect("probe output");
    writer
        .join()
        .expect("writer")
        .expect("probe reads its input");
    (out.status.success(), out.stdout)
}

/// A deterministic 64-bit generator (xorshift*), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
