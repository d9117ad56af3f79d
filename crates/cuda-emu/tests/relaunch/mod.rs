//! Re-running one test in a child process whose NVIDIA libraries resolve to the emulator.
//!
//! The `cudarc_*` tests reach the emulator the way kiln does: cudarc dlopens `libcuda.so.1`,
//! `libnvrtc.so.13`, `libcublas.so.13` or `libnccl.so.2` by name. The parent test links those
//! names to the `libkiln_cuda_emu.so` cargo built next to the test binary, puts the folder on
//! `LD_LIBRARY_PATH` and runs the same test again as a child, with only the emulator variables
//! the test names (every other `KILN_EMU_*` is removed, so the suite gives the same result under
//! `cargo xtask emu`). This module never names the emulator crate, so the test binary does not
//! link a second copy of it. A missing library fails the test: it cannot pass without running.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Set in the child's environment.
pub const CHILD: &str = "KILN_EMU_TEST_CHILD";

/// The emulator variables a child may inherit when its test does not set them: the module
/// cache only changes how fast kernels compile, never what they do.
const INHERITED: &[&str] = &["KILN_EMU_CACHE"];

/// Whether this process is the child (run the scenario).
pub fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// The sonames cudarc opens for one NVIDIA library (`cuda`, `nvrtc`, `cublas`, `nccl`).
fn sonames(library: &str) -> [String; 2] {
    let version = match library {
        "cuda" => "1",
        "nvrtc" | "cublas" => "13",
        "nccl" => "2",
        other => panic!("relaunch: no soname known for lib{other}"),
    };
    [
        format!("lib{library}.so"),
        format!("lib{library}.so.{version}"),
    ]
}

/// Runs test `test` of this binary again in a child process with `libraries` resolving to the
/// emulator and `env` set, and returns the child's output (the caller asserts on it).
pub fn run_child(test: &str, libraries: &[&str], env: &[(&str, &str)]) -> Output {
    let exe = std::env::current_exe().expect("the test binary's path");
    let emulator: PathBuf = exe
        .parent()
        .expect("the test binary's folder")
        .join("libkiln_cuda_emu.so");
    assert!(
        emulator.exists(),
        "{} was not built next to the test binary; run the test through `cargo test -p \
         kiln-cuda-emu`, which builds the crate's cdylib first",
        emulator.display()
    );
    let dir = std::env::temp_dir().join(format!("kiln-emu-relaunch-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder for the library links");
    for library in libraries {
        for name in sonames(library) {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&emulator, &link).expect("a library link");
        }
    }
    let mut child = Command::new(&exe);
    child.args(["--exact", test, "--nocapture"]);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("KILN_EMU_") && !INHERITED.contains(&key.as_str()) {
            child.env_remove(&key);
        }
    }
    child.env_remove("CUDA_VISIBLE_DEVICES");
    for (key, value) in env {
        child.env(key, value);
    }
    let out = child
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .expect("the child test process starts");
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// Stdout and stderr of a child, for assertion messages.
pub fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}
