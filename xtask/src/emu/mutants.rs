//! `cargo xtask emu-mutants [--only TEXT]...`: plants known bugs in copies of kiln's kernels and
//! launchers and shows the emulator catches each one, naming the kernel or call.
//!
//! A kernel bug is one text replacement in a copy of a `.cu` file, handed to kiln through the
//! `KILN_KERNEL_SOURCE_DIR` test hook (`kiln_device::cuda::source_override`), with kiln's own
//! GPU tests as the judge; a launcher bug is a case of `xtask emu-probe` ([`super::probe`]).
//! For every mutant: first the same command without the bug must pass (else a failure proves
//! nothing), then with the bug it must fail and its output must hold every text of `expect`
//! (the kernel or call it names), and, for kernel bugs, kiln's line saying it compiled the copy.
//!
//! Invariants: the source tree is never written (copies go to `target/cuda-emu/mutants/`); a
//! replacement whose text does not occur exactly once in the real file is an error of the
//! harness, not a "caught"; the task fails unless every mutant passed clean and was caught.

use std::path::Path;
use std::time::Instant;

use super::args;
use super::build::{build_workspace, Built};
use super::runner::{self, Outcome, Run};
use super::Emulator;

/// How a bug is planted.
pub enum Plant {
    /// Replace `find` (exactly one occurrence) by `replace` in kiln-device's `src/<file>`, and
    /// run test binary `binary` with `filter`.
    Kernel {
        /// The `.cu` file relative to kiln-device's `src/`.
        file: &'static str,
        /// Text to replace.
        find: &'static str,
        /// Its replacement.
        replace: &'static str,
        /// The test binary (as [`Built::name`]).
        binary: &'static str,
        /// Test name filter.
        filter: &'static str,
    },
    /// Run `xtask emu-probe <case>`, then with `--bug`.
    Probe {
        /// The case.
        case: &'static str,
    },
}

/// One planted bug.
pub struct Mutant {
    /// What the bug is.
    pub bug: &'static str,
    /// Where it is planted.
    pub place: &'static str,
    /// How.
    pub plant: Plant,
    /// Extra variables for both runs.
    pub env: &'static [(&'static str, &'static str)],
    /// Texts the failing output must hold.
    pub expect: &'static [&'static str],
}

/// The planted bugs.
pub const MUTANTS: [Mutant; 11] = [
    Mutant {
        bug: "off-by-one in a reduction tail",
        place: "ops/reduce/reduce.cu fold_chunk (vector path's scalar tail)",
        plant: Plant::Kernel {
            file: "ops/reduce/reduce.cu",
            find: "for (u64 j = lo + packs * V + threadIdx.x; j < hi; j += step) {",
            replace: "for (u64 j = lo + packs * V + threadIdx.x; j + 1 < hi; j += step) {",
            binary: "kiln-device--test-cuda_ops",
            filter: "reductions_match_cpu_on_every_dim_set",
        },
        env: &[],
        expect: &["panicked"],
    },
    Mutant {
        bug: "missing __syncthreads",
        place: "ops/reduce/reduce.cu block_reduce (between the warp states' store and load)",
        plant: Plant::Kernel {
            file: "ops/reduce/reduce.cu",
            find: "    if (lane == 0) warp_states[warp] = s;\n    __syncthreads();\n",
            replace: "    if (lane == 0) warp_states[warp] = s;\n",
            binary: "kiln-device--test-cuda_ops",
            filter: "reductions_match_cpu_on_every_dim_set",
        },
        env: &[],
        expect: &["panicked"],
    },
    Mutant {
        bug: "wrong shuffle offset",
        place: "ops/reduce/reduce.cu warp_reduce (first __shfl_down_sync offset 8, not 16)",
        plant: Plant::Kernel {
            file: "ops/reduce/reduce.cu",
            find: "for (int o = 16; o > 0; o >>= 1) {",
            replace: "for (int o = 8; o > 0; o >>= 1) {",
            binary: "kiln-device--test-cuda_ops",
            filter: "reductions_match_cpu_on_every_dim_set",
        },
        env: &[],
        expect: &["panicked"],
    },
    Mutant {
        bug: "swapped kernel argument",
        place: "ops/fill/fill.cu kiln_copy_strided_b* (offset and n swapped)",
        plant: Plant::Kernel {
            file: "ops/fill/fill.cu",
            find: "copy_strided_impl<T>(src, offset, layout, dst, n);",
            replace: "copy_strided_impl<T>(src, n, layout, dst, offset);",
            binary: "kiln-device",
            filter: "ops::fill::cuda::tests::strided_copy_matches_cpu",
        },
        env: &[],
        expect: &["panicked"],
    },
    Mutant {
        bug: "wrong bf16 rounding (toward zero)",
        place: "ops/copy/copy.cu from_f64<__nv_bfloat16> (casts to bf16)",
        plant: Plant::Kernel {
            file: "ops/copy/copy.cu",
            find: "return __double2bfloat16(__longlong_as_double((i64)(bits & 0xFFFFFFFF00000000ULL)));",
            replace: "return __float2bfloat16_rz((float)__longlong_as_double((i64)(bits & 0xFFFFFFFF00000000ULL)));",
            binary: "kiln-device--test-cuda_ops",
            filter: "casts_and_copies_match_cpu_bit_for_bit",
        },
        env: &[],
        expect: &["panicked"],
    },
    Mutant {
        bug: "log-sum-exp rounded into the maximum",
        place: "ops/loss/loss.cu xent_index (loss as S * (max + ln sum) - sum of q*w*z)",
        plant: Plant::Kernel {
            file: "ops/loss/loss.cu",
            find: "losses[pos] = (T)(st.qw * log_sum - st.shifted);\n            atomicAdd",
            replace: "losses[pos] = (T)(st.qw * (st.max + log_sum) - (st.shifted + st.qw * st.max));\n            atomicAdd",
            binary: "kiln-losses--test-stability",
            filter: "huge_logits_and_weights_give_pytorchs_losses_and_gradients_on_cuda",
        },
        env: &[],
        expect: &["panicked"],
    },
    Mutant {
        bug: "out-of-bounds store",
        place: "launcher: kiln_fill_f32 given one element more than its buffer",
        plant: Plant::Probe { case: "oob-store" },
        env: &[],
        expect: &["kiln_fill_f32", "CUDA_ERROR_ILLEGAL_ADDRESS"],
    },
    Mutant {
        bug: "host pointer passed to a kernel",
        place: "launcher: a host Vec's address as kiln_fill_f32's dst",
        plant: Plant::Probe {
            case: "host-pointer",
        },
        env: &[],
        expect: &["kiln_fill_f32", "CUDA_ERROR_INVALID_VALUE"],
    },
    Mutant {
        bug: "grid over the limit",
        place: "launcher: kiln_fill_f32 with gridDim.y = 65536",
        plant: Plant::Probe { case: "grid-limit" },
        env: &[],
        expect: &["kiln_fill_f32", "CUDA_ERROR_INVALID_VALUE"],
    },
    Mutant {
        bug: "host read without synchronisation",
        place: "launcher: cuMemcpyDtoH of kiln_fill_f32's output before its stream finished",
        plant: Plant::Probe {
            case: "unsynced-read",
        },
        env: &[("KILN_EMU_DELAY", "1")],
        expect: &["host read of kiln_fill_f32's output"],
    },
    Mutant {
        bug: "allocation over capacity",
        place: "kiln: a cuda:0 tensor larger than the device (256 MiB emulated)",
        plant: Plant::Probe {
            case: "over-capacity",
        },
        env: &[("KILN_EMU_MEMORY", "268435456")],
        expect: &["Tensor::zeros", "out of memory"],
    },
];

/// Runs `cargo xtask emu-mutants`.
pub fn run(argv: &[String]) -> Result<(), String> {
    let mut only: Vec<String> = Vec::new();
    let mut machine: Vec<String> = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == "--only" {
            i += 1;
            only.push(argv.get(i).cloned().ok_or("`--only` needs a value")?);
        } else {
            machine.push(argv[i].clone());
        }
        i += 1;
    }
    let options = args::parse_machine(&machine).map_err(|e| format!("emu-mutants: {e}"))?;
    let root = crate::paths::workspace_root();
    let started = Instant::now();
    let built = build_workspace(&root)?;
    let emulator = Emulator::build(&options)?;
    let out = runner::out_dir("mutants");
    let _ = std::fs::remove_dir_all(&out);
    let mut rows = Vec::new();
    for (index, mutant) in MUTANTS.iter().enumerate() {
        if !only.is_empty() && !only.iter().any(|o| mutant.bug.contains(o.as_str())) {
            continue;
        }
        eprintln!("emu-mutants: [{}] {}", index + 1, mutant.bug);
        let dir = out.join(format!("m{:02}", index + 1));
        rows.push((mutant, check(&emulator, &built, mutant, &dir, &root)?));
    }
    println!();
    println!("| # | bug | where | caught by | message excerpt |");
    println!("|---|---|---|---|---|");
    let mut failures = Vec::new();
    for (n, (mutant, verdict)) in rows.iter().enumerate() {
        let (caught_by, excerpt) = match verdict {
            Verdict::Caught { by, excerpt } => (by.clone(), excerpt.clone()),
            Verdict::Problem(why) => {
                failures.push(format!("{}: {why}", mutant.bug));
                ("NOT CAUGHT".to_string(), why.clone())
            }
        };
        println!(
            "| {} | {} | {} | {caught_by} | {} |",
            n + 1,
            mutant.bug,
            mutant.place,
            excerpt.replace('|', "\\|")
        );
    }
    println!(
        "\nemu-mutants: {} of {} planted bugs caught (each passed unmutated first); {:.0} s",
        rows.len() - failures.len(),
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "emu-mutants: {} not shown caught:\n  {}\nlogs in {}",
            failures.len(),
            failures.join("\n  "),
            out.display()
        ))
    }
}

/// What became of one mutant.
pub enum Verdict {
    /// Passed clean, failed planted, named what was expected.
    Caught {
        /// The command that caught it.
        by: String,
        /// The output line that names the kernel or call.
        excerpt: String,
    },
    /// Anything else, with why.
    Problem(String),
}

fn check(
    emulator: &Emulator,
    built: &[Built],
    mutant: &Mutant,
    dir: &Path,
    root: &Path,
) -> Result<Verdict, String> {
    let env: Vec<(String, String)> = mutant
        .env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (binary, args, by, planted_env, planted_args) = match &mutant.plant {
        Plant::Kernel {
            file,
            find,
            replace,
            binary,
            filter,
        } => {
            let real = root.join("crates/device/src").join(file);
            let text = std::fs::read_to_string(&real)
                .map_err(|e| format!("cannot read {}: {e}", real.display()))?;
            if text.matches(find).count() != 1 {
                return Ok(Verdict::Problem(format!(
                    "the text to replace occurs {} times in {file} (must be once): {find:?}",
                    text.matches(find).count()
                )));
            }
            let copy = dir.join("src").join(file);
            std::fs::create_dir_all(copy.parent().unwrap_or(dir))
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            std::fs::write(&copy, text.replacen(find, replace, 1))
                .map_err(|e| format!("cannot write {}: {e}", copy.display()))?;
            let b = built
                .iter()
                .find(|b| b.name() == *binary)
                .ok_or_else(|| format!("cargo built no test binary {binary}"))?
                .clone();
            let args: Vec<String> = if filter.is_empty() {
                Vec::new()
            } else {
                vec![filter.to_string()]
            };
            let by = format!("{} {}", b.cargo_command(), filter)
                .trim()
                .to_string();
            let mut planted = env.clone();
            planted.push((
                "KILN_KERNEL_SOURCE_DIR".to_string(),
                dir.join("src").display().to_string(),
            ));
            (b, args.clone(), by, planted, args)
        }
        Plant::Probe { case } => {
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find xtask's own path: {e}"))?;
            let b = Built {
                package: "xtask".into(),
                kind: "bin".into(),
                target: "xtask".into(),
                path: exe,
                package_dir: root.to_path_buf(),
            };
            let args = vec!["emu-probe".to_string(), case.to_string()];
            let mut planted_args = args.clone();
            planted_args.push("--bug".to_string());
            let by = format!("cargo xtask emu -- cargo xtask emu-probe {case} --bug");
            (b, args, by, env.clone(), planted_args)
        }
    };
    let limit = runner::limit(600);
    let clean = runner::run(
        emulator,
        &Run {
            built: &binary,
            args,
            env: env.clone(),
            log: dir.join("clean.log"),
            limit,
        },
    )?;
    if !clean.ok() {
        return Ok(Verdict::Problem(format!(
            "fails WITHOUT the bug too (exit {:?}), so it proves nothing: {}",
            clean.code,
            last_line(&clean)
        )));
    }
    let planted = runner::run(
        emulator,
        &Run {
            built: &binary,
            args: planted_args,
            env: planted_env,
            log: dir.join("planted.log"),
            limit,
        },
    )?;
    if planted.ok() {
        return Ok(Verdict::Problem(
            "passes with the bug planted (not caught)".to_string(),
        ));
    }
    if let Plant::Kernel { file, .. } = &mutant.plant {
        if !planted.log.contains(&format!("compiling {file} from")) {
            return Ok(Verdict::Problem(format!(
                "kiln never compiled the planted copy of {file} (the hook was not used)"
            )));
        }
    }
    let missing: Vec<&str> = mutant
        .expect
        .iter()
        .copied()
        .filter(|t| !planted.log.contains(t))
        .collect();
    if !missing.is_empty() {
        return Ok(Verdict::Problem(format!(
            "failed, but the output lacks {missing:?}: {}",
            last_line(&planted)
        )));
    }
    Ok(Verdict::Caught {
        by,
        excerpt: excerpt(&planted, mutant.expect),
    })
}

/// The first log line holding the first expected text (the kernel or call), else the last line;
/// for a test's panic, the panic message (the line after `panicked at ...:`).
fn excerpt(outcome: &Outcome, expect: &[&str]) -> String {
    let lines: Vec<&str> = outcome.log.lines().collect();
    let at = expect
        .first()
        .and_then(|t| lines.iter().position(|l| l.contains(t)))
        .unwrap_or(lines.len().saturating_sub(1));
    let mut line = lines.get(at).copied().unwrap_or("");
    if line.contains("panicked at") {
        line = lines.get(at + 1).copied().unwrap_or(line);
    }
    shorten(line.trim(), 160)
}

fn last_line(outcome: &Outcome) -> String {
    shorten(outcome.tail(1).trim(), 160)
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let cut: String = text.chars().take(max).collect();
        format!("{cut}…")
    }
}
