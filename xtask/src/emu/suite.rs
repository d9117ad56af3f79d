//! `cargo xtask emu-suite [MACHINE FLAGS] [--only TEXT]... [--list]`: every GPU test of the
//! workspace, and the CUDA runs of the examples, under the emulator with `KILN_REQUIRE_CUDA=1`.
//!
//! What runs: every test binary `cargo test --workspace` builds that holds GPU tests (the same
//! rule as `cargo xtask gpu-pack`: it contains the `KILN_REQUIRE_CUDA` text of
//! `kiln_device::testing::cuda_device_or_skip`, or it is one of kiln-device's), whole, so no GPU
//! test can be left out by a stale list; then the [`EXAMPLES`]: `train` on `--device cuda` for a
//! short run without and with `--amp`, and `devices` with three emulated devices and a
//! `CUDA_VISIBLE_DEVICES` mask, each with the output checks that show it really ran on CUDA.
//!
//! Invariants: the build is CI's test step's (see [`super::build`]), so nothing is rebuilt;
//! every run gets `KILN_REQUIRE_CUDA=1`, so a skip fails; each binary has its own log under
//! `target/cuda-emu/suite/` and a time limit ([`super::runner::limit`]); the task fails when any
//! run failed, and prints one table row per run with its cargo command.

use std::time::Instant;

use super::args;
use super::build::{build_workspace, Built};
use super::runner::{self, Outcome, Run};
use super::Emulator;
use crate::gpu_pack::is_gpu_binary;

/// The example runs: name, example, arguments, extra variables, and texts the output must hold.
pub struct ExampleRun {
    /// Name in the table.
    pub name: &'static str,
    /// The example target.
    pub example: &'static str,
    /// Its arguments (`{run_dir}` is replaced by a fresh folder).
    pub args: &'static [&'static str],
    /// Extra variables.
    pub env: &'static [(&'static str, &'static str)],
    /// Every one must appear in the output.
    pub expect: &'static [&'static str],
}

const TRAIN_SHORT: &[&str] = &[
    "--device",
    "cuda",
    "--epochs",
    "1",
    "--freeze-epochs",
    "0",
    "--data",
    "synthetic:64",
    "--batch-size",
    "16",
    "--width",
    "4",
    "--run-dir",
    "{run_dir}",
];

const TRAIN_SHORT_AMP: &[&str] = &[
    "--device",
    "cuda",
    "--epochs",
    "1",
    "--freeze-epochs",
    "0",
    "--data",
    "synthetic:64",
    "--batch-size",
    "16",
    "--width",
    "4",
    "--run-dir",
    "{run_dir}",
    "--amp",
];

/// The example runs of the suite.
pub const EXAMPLES: [ExampleRun; 3] = [
    ExampleRun {
        name: "train --device cuda",
        example: "train",
        args: TRAIN_SHORT,
        env: &[],
        expect: &["training on cuda:0 (--device cuda)", "train loss"],
    },
    ExampleRun {
        name: "train --device cuda --amp",
        example: "train",
        args: TRAIN_SHORT_AMP,
        env: &[],
        expect: &["training on cuda:0 (--device cuda)", "train loss"],
    },
    ExampleRun {
        name: "devices (3 emulated, CUDA_VISIBLE_DEVICES=2,0)",
        example: "devices",
        args: &[],
        env: &[("KILN_EMU_DEVICES", "3"), ("CUDA_VISIBLE_DEVICES", "2,0")],
        expect: &[
            "CUDA devices visible: 2",
            "cuda:0 (physical 2)",
            "cuda:1 (physical 0)",
        ],
    },
];

/// Runs `cargo xtask emu-suite`.
pub fn run(argv: &[String]) -> Result<(), String> {
    let mut only: Vec<String> = Vec::new();
    let mut list = false;
    let mut machine: Vec<String> = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        match argv[i].as_str() {
            "--only" => {
                i += 1;
                only.push(argv.get(i).cloned().ok_or("`--only` needs a value")?);
            }
            "--list" => list = true,
            other => machine.push(other.to_string()),
        }
        i += 1;
    }
    let options = args::parse_machine(&machine).map_err(|e| {
        format!(
            "emu-suite: {e}\nusage: cargo xtask emu-suite [--only TEXT]... [--list] {}",
            args::FLAGS_USAGE.split(" -- CMD...").next().unwrap_or("")
        )
    })?;
    let root = crate::paths::workspace_root();
    let started = Instant::now();
    let built = build_workspace(&root)?;
    let tests = gpu_test_binaries(&built)?;
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| name.contains(o.as_str()));
    if list {
        for b in tests.iter().filter(|b| wanted(&b.name())) {
            println!(
                "KILN_REQUIRE_CUDA=1 cargo xtask emu -- {}",
                b.cargo_command()
            );
        }
        for e in EXAMPLES.iter().filter(|e| wanted(e.name)) {
            println!(
                "{}: example {} {:?} env {:?}",
                e.name, e.example, e.args, e.env
            );
        }
        return Ok(());
    }
    let emulator = Emulator::build(&options)?;
    let logs = runner::out_dir("suite");
    let mut rows: Vec<(String, String, Outcome, Option<String>)> = Vec::new();
    for b in tests.iter().filter(|b| wanted(&b.name())) {
        eprintln!("emu-suite: {}", b.cargo_command());
        let outcome = runner::run(
            &emulator,
            &Run {
                built: b,
                args: Vec::new(),
                env: Vec::new(),
                log: runner::log_path(&logs, &b.name()),
                limit: runner::limit(900),
            },
        )?;
        let problem = (!outcome.ok()).then(|| "tests failed".to_string());
        rows.push((b.name(), b.cargo_command(), outcome, problem));
    }
    for example in EXAMPLES.iter().filter(|e| wanted(e.name)) {
        let row = run_example(&emulator, &built, example, &logs)?;
        rows.push(row);
    }
    print_table(&rows, started.elapsed().as_secs_f64());
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.3.is_some())
        .map(|r| r.0.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "emu-suite: {} of {} runs failed: {}; logs in {}",
            failed.len(),
            rows.len(),
            failed.join(", "),
            logs.display()
        ))
    }
}

/// Test binaries that reach CUDA without `cuda_device_or_skip` (they read `cuda_status()` or
/// make a `Device::Cuda` tensor and accept either outcome), so the text rule misses them.
pub const ALSO_GPU: [&str; 2] = ["kiln--test-guide", "kiln-autograd--test-errors"];

/// The test binaries holding GPU tests; an error when there are none (the rule went stale) or
/// when one of [`ALSO_GPU`] is gone.
pub fn gpu_test_binaries(built: &[Built]) -> Result<Vec<Built>, String> {
    let mut out = Vec::new();
    for b in built.iter().filter(|b| b.kind != "example") {
        let bytes =
            std::fs::read(&b.path).map_err(|e| format!("cannot read {}: {e}", b.path.display()))?;
        if is_gpu_binary(&b.name(), &bytes) || ALSO_GPU.contains(&b.name().as_str()) {
            out.push(b.clone());
        }
    }
    if out.is_empty() {
        return Err("no test binary holds GPU tests: the selection rule is stale".to_string());
    }
    for name in ALSO_GPU {
        if !out.iter().any(|b| b.name() == name) {
            return Err(format!("the test binary {name} is gone; update ALSO_GPU"));
        }
    }
    Ok(out)
}

fn run_example(
    emulator: &Emulator,
    built: &[Built],
    example: &ExampleRun,
    logs: &std::path::Path,
) -> Result<(String, String, Outcome, Option<String>), String> {
    let binary = built
        .iter()
        .find(|b| b.kind == "example" && b.target == example.example)
        .ok_or_else(|| format!("cargo built no `{}` example", example.example))?;
    let run_dir = runner::out_dir("suite-runs").join(example.example);
    let _ = std::fs::remove_dir_all(&run_dir);
    let args: Vec<String> = example
        .args
        .iter()
        .map(|a| a.replace("{run_dir}", &run_dir.display().to_string()))
        .collect();
    eprintln!("emu-suite: {} {}", binary.cargo_command(), args.join(" "));
    let outcome = runner::run(
        emulator,
        &Run {
            built: binary,
            args: args.clone(),
            env: example
                .env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: runner::log_path(logs, example.name),
            limit: runner::limit(900),
        },
    )?;
    let missing: Vec<&str> = example
        .expect
        .iter()
        .copied()
        .filter(|text| !outcome.log.contains(text))
        .collect();
    let problem = if !outcome.ok() {
        Some("exit status".to_string())
    } else if outcome.log.contains("loss NaN") || outcome.log.contains("loss nan") {
        Some("a NaN loss".to_string())
    } else if !missing.is_empty() {
        Some(format!("output lacks {missing:?}"))
    } else {
        None
    };
    let command = format!(
        "{}{} -- {}",
        example
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v} "))
            .collect::<String>(),
        binary.cargo_command(),
        args.join(" ")
    );
    Ok((example.name.to_string(), command, outcome, problem))
}

fn print_table(rows: &[(String, String, Outcome, Option<String>)], seconds: f64) {
    println!();
    println!("| run | result | tests passed / failed | seconds | command |");
    println!("|---|---|---|---|---|");
    let (mut passed, mut failed) = (0, 0);
    for (name, command, outcome, problem) in rows {
        passed += outcome.passed;
        failed += outcome.failed;
        let result = match problem {
            None => "PASS".to_string(),
            Some(why) => format!("FAIL ({why}, exit {:?})", outcome.code),
        };
        println!(
            "| {name} | {result} | {} / {} | {:.1} | `{command}` |",
            outcome.passed, outcome.failed, outcome.seconds
        );
    }
    println!();
    println!(
        "emu-suite: {} runs, {} failed; {passed} tests passed, {failed} failed; {seconds:.0} s",
        rows.len(),
        rows.iter().filter(|r| r.3.is_some()).count()
    );
    for (name, _, outcome, problem) in rows {
        if problem.is_some() {
            println!(
                "\n--- {name}: last lines of its log ---\n{}",
                outcome.tail(40)
            );
        }
    }
}
