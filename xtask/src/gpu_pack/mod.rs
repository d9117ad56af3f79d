//! `cargo xtask gpu-pack`: everything a GPU machine without Rust needs to run kiln's GPU checks.
//!
//! The GPU machine has a driver, a CUDA toolkit and Python but no Rust toolchain and no network
//! (see `docs/GPU.md`). So we build here and ship binaries:
//!
//! - the test binaries with GPU tests, built in release mode and found by parsing the JSON
//!   messages of `cargo test --workspace --release --no-run --message-format=json` (xtask's own
//!   tests are left out: they check this development machine, not the GPU), as `tests/` in the
//!   archive;
//! - the running `xtask` binary itself, the benchmark runner (`xtask bench --gpu-only`), in the
//!   archive too;
//! - `run.sh` (source: `xtask/src/gpu_pack/run.sh`), which finds the CUDA libraries, sets
//!   `KILN_REQUIRE_CUDA=1` and runs the tests, then the benchmarks, then the CPU's `threads`
//!   group, writing logs, `gpu-bench.json` and `cpu-bench.json` to `$OUT`;
//! - `MANIFEST.txt`: commit, date, toolchain and the list of binaries.
//!
//! Only the test binaries that hold GPU tests go in (those calling
//! `kiln_device::testing::cuda_device_or_skip`, found by its text in the binary, plus all of
//! kiln-device's); the CPU-only ones are CI's. Binaries are stripped of debug info (symbols
//! stay, so panics still name functions) and packed with the bench runner into one xz archive
//! ([`ARCHIVE`], ~20x smaller than the binaries, which share most of their code) that run.sh
//! unpacks. The folder's size is printed; over [`SIZE_LIMIT`] is an error, since the pack must
//! travel to the GPU machine through a 64 MiB channel.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The most the pack folder may weigh.
pub const SIZE_LIMIT: u64 = 64 << 20;

const RUN_SH: &str = include_str!("run.sh");

/// One test binary cargo built.
#[derive(Debug, PartialEq)]
pub struct TestBinary {
    /// File name in the pack, e.g. `kiln-device` or `kiln-device--test-visibility`.
    pub name: String,
    /// Where cargo put it.
    pub path: PathBuf,
}

/// Runs `cargo xtask gpu-pack`.
pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!("`gpu-pack` takes no arguments (got `{arg}`)"));
    }
    let root = crate::paths::workspace_root();
    let pack = crate::paths::target_dir(&root).join("gpu-pack");

    let all = build_test_binaries(&root)?;
    if all.is_empty() {
        return Err("cargo built no test binaries; is the workspace empty?".to_string());
    }
    let (binaries, cpu_only) = select_gpu_binaries(all)?;

    if pack.exists() {
        std::fs::remove_dir_all(&pack)
            .map_err(|e| format!("cannot remove the old {}: {e}", pack.display()))?;
    }
    let tests_dir = pack.join("tests");
    std::fs::create_dir_all(&tests_dir)
        .map_err(|e| format!("cannot create {}: {e}", tests_dir.display()))?;

    let mut packed = Vec::new();
    for binary in &binaries {
        let dest = tests_dir.join(&binary.name);
        copy_executable(&binary.path, &dest)?;
        packed.push(dest);
    }
    let xtask_exe =
        std::env::current_exe().map_err(|e| format!("cannot find xtask's own path: {e}"))?;
    let xtask_dest = pack.join("xtask");
    copy_executable(&xtask_exe, &xtask_dest)?;
    packed.push(xtask_dest);

    let strip_note = match strip_debug_info(&packed) {
        Ok(()) => "stripped of debug info".to_string(),
        Err(e) => {
            eprintln!("xtask: warning: {e}; the pack keeps its debug info");
            "NOT stripped".to_string()
        }
    };
    // One xz archive: the binaries share most of their code, so it is ~20x smaller than them.
    compress(&pack, &["tests", "xtask"], ARCHIVE)?;

    let run_sh = pack.join("run.sh");
    std::fs::write(&run_sh, RUN_SH)
        .map_err(|e| format!("cannot write {}: {e}", run_sh.display()))?;
    set_executable(&run_sh)?;
    let manifest = manifest(&root, &binaries, &cpu_only);
    std::fs::write(pack.join("MANIFEST.txt"), manifest)
        .map_err(|e| format!("cannot write MANIFEST.txt: {e}"))?;

    let size = folder_size(&pack)?;
    for binary in &binaries {
        println!("packed  tests/{}", binary.name);
    }
    println!("packed  xtask (bench runner: `xtask bench --gpu-only`)");
    println!(
        "left out {} CPU-only test binaries (no GPU test in them; CI runs them)",
        cpu_only.len()
    );
    println!(
        "{}: {} test binaries + xtask in {ARCHIVE}, {strip_note}, {:.1} MiB",
        pack.display(),
        binaries.len(),
        size as f64 / (1u64 << 20) as f64
    );
    println!(
        "on the GPU machine: `OUT=<folder> ./run.sh` (logs, summary.txt, gpu-bench.json; see docs/GPU.md)"
    );
    if size > SIZE_LIMIT {
        return Err(format!(
            "the pack weighs {:.1} MiB, over the {} MiB limit: strip symbols too (`strip -s`) or \
             find which test binary grew (`tar -tvJf {}/{ARCHIVE}`)",
            size as f64 / (1u64 << 20) as f64,
            SIZE_LIMIT >> 20,
            pack.display()
        ));
    }
    Ok(())
}

/// The archive run.sh unpacks: `tests/` and `xtask`.
pub const ARCHIVE: &str = "bin.tar.xz";

/// What marks a test binary that holds GPU tests: the variable of
/// `kiln_device::testing::cuda_device_or_skip`, whose text only a binary calling it contains.
const GPU_TEST_MARK: &[u8] = b"KILN_REQUIRE_CUDA";

/// Whether a test binary belongs on the GPU machine: it holds GPU tests (calls
/// `cuda_device_or_skip`), or it is one of kiln-device's own (driver probe, visibility, memory).
pub fn is_gpu_binary(name: &str, bytes: &[u8]) -> bool {
    name.starts_with("kiln-device")
        || bytes
            .windows(GPU_TEST_MARK.len())
            .any(|w| w == GPU_TEST_MARK)
}

/// Splits the built binaries into (for the GPU machine, CPU-only). The CPU-only ones are run by
/// CI; leaving them out keeps the pack small and the GPU run short.
fn select_gpu_binaries(all: Vec<TestBinary>) -> Result<(Vec<TestBinary>, Vec<TestBinary>), String> {
    let mut gpu = Vec::new();
    let mut cpu_only = Vec::new();
    for binary in all {
        let bytes = std::fs::read(&binary.path)
            .map_err(|e| format!("cannot read {}: {e}", binary.path.display()))?;
        if is_gpu_binary(&binary.name, &bytes) {
            gpu.push(binary);
        } else {
            cpu_only.push(binary);
        }
    }
    if gpu.is_empty() {
        return Err(format!(
            "no test binary contains `{}`: the GPU tests are gone or no longer use \
             kiln_device::testing::cuda_device_or_skip",
            String::from_utf8_lossy(GPU_TEST_MARK)
        ));
    }
    Ok((gpu, cpu_only))
}

/// `tar -cJf pack/archive entries...`, then removes the entries.
fn compress(pack: &Path, entries: &[&str], archive: &str) -> Result<(), String> {
    let status = Command::new("tar")
        .current_dir(pack)
        .env("XZ_OPT", "-6 -T0")
        .arg("-cJf")
        .arg(archive)
        .args(entries)
        .status()
        .map_err(|e| format!("cannot run `tar` ({e}); install tar and xz-utils"))?;
    if !status.success() {
        return Err(format!("`tar -cJf {archive}` failed ({status})"));
    }
    for entry in entries {
        let path = pack.join(entry);
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Builds the release test binaries and lists them.
fn build_test_binaries(root: &Path) -> Result<Vec<TestBinary>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(&cargo)
        .current_dir(root)
        .args([
            "test",
            "--workspace",
            "--release",
            "--no-run",
            "--message-format=json",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run `{cargo} test`: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        // With --message-format=json the compiler's errors arrive on stdout as JSON: show them.
        for text in rendered_errors(&stdout) {
            eprint!("{text}");
        }
        return Err(format!(
            "`cargo test --workspace --release --no-run` failed ({}); see the errors above",
            output.status
        ));
    }
    parse_test_binaries(&stdout)
}

/// The rendered text of every compiler error in cargo's JSON messages.
pub fn rendered_errors(messages: &str) -> Vec<String> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-message" && m["message"]["level"] == "error")
        .filter_map(|m| m["message"]["rendered"].as_str().map(str::to_string))
        .collect()
}

/// The test executables in cargo's JSON messages, named for the pack, xtask's own left out.
pub fn parse_test_binaries(messages: &str) -> Result<Vec<TestBinary>, String> {
    let mut binaries: Vec<TestBinary> = Vec::new();
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let message: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("cannot parse cargo's JSON message `{line}`: {e}"))?;
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        let Some(path) = message["executable"].as_str() else {
            continue;
        };
        let package = package_name(message["package_id"].as_str().unwrap_or_default());
        if package == "xtask" {
            continue;
        }
        let kind = message["target"]["kind"][0].as_str().unwrap_or("test");
        let target = message["target"]["name"].as_str().unwrap_or("unknown");
        let name = if kind == "lib" {
            package.clone()
        } else {
            format!("{package}--{kind}-{target}")
        };
        if binaries.iter().any(|b| b.name == name) {
            return Err(format!(
                "two test binaries would both be named `{name}` in the pack"
            ));
        }
        binaries.push(TestBinary {
            name,
            path: PathBuf::from(path),
        });
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(binaries)
}

/// The package name in a cargo package id, in either format:
/// `path+file:///w/crates/device#kiln-device@0.1.0`, `path+file:///w/xtask#0.1.0` (name = last
/// path component) or the old `kiln-device 0.1.0 (path+file:///w/crates/device)`.
pub fn package_name(package_id: &str) -> String {
    if let Some((url, fragment)) = package_id.split_once('#') {
        if let Some((name, _version)) = fragment.split_once('@') {
            return name.to_string();
        }
        return url.rsplit('/').next().unwrap_or(url).to_string();
    }
    package_id
        .split(' ')
        .next()
        .unwrap_or(package_id)
        .to_string()
}

fn copy_executable(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to)
        .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
    set_executable(to)
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot make {} executable: {e}", path.display()))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<(), String> {
    Ok(())
}

fn strip_debug_info(files: &[PathBuf]) -> Result<(), String> {
    let status = Command::new("strip")
        .arg("--strip-debug")
        .args(files)
        .status()
        .map_err(|e| format!("cannot run `strip` ({e}); install binutils"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`strip --strip-debug` failed ({status})"))
    }
}

fn manifest(root: &Path, binaries: &[TestBinary], cpu_only: &[TestBinary]) -> String {
    let run = |program: &str, args: &[&str]| {
        Command::new(program)
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".to_string())
    };
    let mut text = format!(
        "commit: {}{}\nbuilt: {}\nrustc: {}\n\ntests/:\n",
        run("git", &["rev-parse", "--short=12", "HEAD"]),
        if run("git", &["status", "--porcelain"]).is_empty() {
            ""
        } else {
            " (with uncommitted changes)"
        },
        run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        run("rustc", &["--version"]),
    );
    for binary in binaries {
        text.push_str(&format!("  {}\n", binary.name));
    }
    text.push_str("xtask: bench runner (`xtask bench --gpu-only`)\n");
    text.push_str("\nleft out (CPU-only, run by CI):\n");
    for binary in cpu_only {
        text.push_str(&format!("  {}\n", binary.name));
    }
    text
}

fn folder_size(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in
        std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?
    {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let meta = entry
            .metadata()
            .map_err(|e| format!("cannot stat {}: {e}", entry.path().display()))?;
        total += if meta.is_dir() {
            folder_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_from_every_id_format() {
        assert_eq!(
            package_name("path+file:///w/crates/device#kiln-device@0.1.0"),
            "kiln-device"
        );
        assert_eq!(package_name("path+file:///w/crates/kiln#0.1.0"), "kiln");
        assert_eq!(
            package_name("kiln-device 0.1.0 (path+file:///w/crates/device)"),
            "kiln-device"
        );
    }

    #[test]
    fn picks_test_executables_and_names_them() {
        let messages = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/device#kiln-device@0.1.0","target":{"kind":["lib"],"name":"kiln_device"},"profile":{"test":true},"executable":"/w/target/release/deps/kiln_device-1a2b"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/device#kiln-device@0.1.0","target":{"kind":["lib"],"name":"kiln_device"},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/device#kiln-device@0.1.0","target":{"kind":["test"],"name":"visibility"},"profile":{"test":true},"executable":"/w/target/release/deps/visibility-3c4d"}
{"reason":"compiler-artifact","package_id":"path+file:///w/xtask#0.1.0","target":{"kind":["bin"],"name":"xtask"},"profile":{"test":true},"executable":"/w/target/release/deps/xtask-5e6f"}
{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#half@2.4.1","target":{"kind":["lib"],"name":"half"},"profile":{"test":false},"executable":null}
{"reason":"build-finished","success":true}"#;
        let binaries = parse_test_binaries(messages).unwrap();
        assert_eq!(
            binaries,
            [
                TestBinary {
                    name: "kiln-device".into(),
                    path: "/w/target/release/deps/kiln_device-1a2b".into()
                },
                TestBinary {
                    name: "kiln-device--test-visibility".into(),
                    path: "/w/target/release/deps/visibility-3c4d".into()
                },
            ]
        );
    }

    #[test]
    fn gpu_binaries_are_kiln_devices_and_those_holding_gpu_tests() {
        assert!(is_gpu_binary("kiln-device--test-visibility", b"nothing"));
        assert!(is_gpu_binary(
            "kiln-losses--test-parity",
            b"..KILN_REQUIRE_CUDA.."
        ));
        assert!(!is_gpu_binary(
            "kiln-sched--test-parity",
            b"KILN_REQUIRE_CUD"
        ));
    }

    #[test]
    fn compiler_errors_are_taken_from_the_json_messages() {
        let messages = concat!(
            r#"{"reason":"compiler-message","message":{"level":"warning","rendered":"w\n"}}"#,
            "\n",
            r#"{"reason":"compiler-message","message":{"level":"error","rendered":"error[E0308]: x\n"}}"#,
            "\nnot json\n",
            r#"{"reason":"build-finished","success":false}"#,
        );
        assert_eq!(
            rendered_errors(messages),
            vec!["error[E0308]: x\n".to_string()]
        );
    }

    #[test]
    fn run_sh_sets_require_cuda_and_writes_gpu_bench_json() {
        assert!(RUN_SH.starts_with("#!/usr/bin/env bash"));
        assert!(RUN_SH.contains("export KILN_REQUIRE_CUDA=1"));
        assert!(RUN_SH.contains("gpu-bench.json"));
        // The CPU side runs the `threads` group by default.
        assert!(RUN_SH.contains("KILN_CPU_BENCH-threads") && RUN_SH.contains("cpu-bench.json"));
        // Then a profile of the child at every core, optional (perf may be missing).
        assert!(RUN_SH.contains("bench-threads-child \"$cores\" 32 10 --no-passes"));
        assert!(RUN_SH.contains("SKIP  perf profile of the CPU step: no perf"));
        // Only the CUDA cases of every group, with the report under $OUT (KILN_BENCH_OUT):
        // xtask's default target dir is the build machine's workspace path.
        assert!(RUN_SH.contains("bench --gpu-only --vs-torch"));
        assert!(RUN_SH.contains("KILN_BENCH_OUT=\"$LOGS/bench\""));
        assert!(RUN_SH.contains("LOGS=\"$OUT/logs\""));
        // A skip passes, so the summary must show it: the NCCL tests' `skipping: ...` too.
        assert!(RUN_SH.contains("grep -cE '^skipping[ :]'"));
        // NVRTC's folder precedes the driver's on LD_LIBRARY_PATH (cudarc tries the
        // unversioned name first, which a distribution's older NVRTC may own there).
        let at = |s: &str| RUN_SH.find(s).expect(s);
        assert!(at("find_lib_dir libnvrtc.so") < at("find_lib_dir libcuda.so"));
    }
}
