//! `cargo xtask bench [GROUP ...] [--quick] [--gpu | --gpu-only] [--vs-torch
//! [--torch-steady-malloc]]`: runs benchmark groups, prints a table and writes `report.json` (an array of rows) and `report.md` to
//! `$KILN_BENCH_OUT`, or to `target/kiln-bench/` when it is unset. `--gpu-only` runs just the
//! CUDA cases of every group (what the GPU machine of `cargo xtask gpu-pack` runs).
//! `--vs-torch` also runs the `train`, `ops`, `optim`, `clip` and `data` CPU cases in PyTorch in the
//! same run, in rounds alternating with kiln's (`torch.rs`; `$KILN_TORCH_PYTHON`, else
//! `python3`), and adds kiln/PyTorch rows; without PyTorch those rows keep kiln's figure and say
//! why PyTorch's is missing. With `--gpu` / `--gpu-only` it does the same for the CUDA cases of
//! `ops` (matmul, the ResNet18 step), `optim` (AdamW) and `clip` (f32 clipping), PyTorch running
//! on the same GPU. `--torch-steady-malloc` runs the CPU cases' interpreters with glibc's
//! allocator keeping the memory PyTorch frees (fixed mmap and trim thresholds), as a tuned PyTorch
//! setup would with jemalloc or tcmalloc; the reference column says so.
//!
//! A row is `{"group", "case", "metric", "value", "reference", "ratio"}`; `ratio` compares
//! kiln's figure with the reference measured in the same run (or a stated target), oriented so
//! that `ratio >= 1` means kiln is better. A group is a function from [`Options`] to rows;
//! adding one is one line in [`GROUPS`]. The shared pieces (rows, options, timers) are in
//! `harness.rs`, which imports no group, so groups depend on it and never on this file.

mod alloc;
mod alloc_real;
mod alloc_traces;
mod clip;
mod clip_gpu;
mod conv_shapes;
mod data;
mod distributed;
pub mod distributed_mpi;
mod distributed_parts;
mod harness;
mod ops;
mod ops_gpu;
mod ops_gpu_conv;
mod ops_loss;
mod optim;
mod optim_gpu;
pub mod threads;
mod torch;
mod train;
mod train_gpt;
mod train_small;

use harness::{cpu_then_gpu, Options, Row, FAILED};
use std::fmt::Write as _;
use std::path::PathBuf;

type Group = fn(&Options) -> Result<Vec<Row>, String>;

/// Every benchmark group: name and entry point. Add a group with a `mod` line above and one
/// entry here.
/// One entry per line (kept by `rustfmt::skip`) so groups added in parallel merge cleanly.
#[rustfmt::skip]
const GROUPS: &[(&str, Group)] = &[
    ("alloc", alloc::run),
    ("clip", |options| cpu_then_gpu(options, clip::cpu_cases, clip_gpu::run)),
    ("optim", |options| cpu_then_gpu(options, optim::cpu_cases, optim_gpu::run)),
    ("ops", ops::run),
    ("train", |options| {
        let cases = [train::run, train_small::run, train_gpt::run];
        Ok(cases.iter().map(|run| run(options)).collect::<Result<Vec<_>, _>>()?.concat())
    }),
    ("threads", threads::run),
    ("data", data::run),
    ("distributed", distributed::run),
];

const USAGE: &str = "usage: cargo xtask bench [GROUP ...] [--quick] [--gpu | --gpu-only] \
                     [--vs-torch [--torch-steady-malloc]]";

/// Runs the subcommand.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut options = Options::default();
    let mut selected: Vec<(&str, Group)> = Vec::new();
    for arg in args {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--gpu" => options.gpu = true,
            "--vs-torch" => options.vs_torch = true,
            "--torch-steady-malloc" => options.torch_steady_malloc = true,
            "--gpu-only" => {
                options.gpu = true;
                options.gpu_only = true;
            }
            "-h" | "--help" => {
                println!("{USAGE}\ngroups: {}", group_names());
                return Ok(());
            }
            name => match GROUPS.iter().find(|(n, _)| *n == name) {
                Some(&g) => selected.push(g),
                None => {
                    return Err(format!(
                        "unknown group or flag `{name}`; groups: {}\n{USAGE}",
                        group_names()
                    ))
                }
            },
        }
    }
    if options.torch_steady_malloc && !options.vs_torch {
        return Err(format!(
            "--torch-steady-malloc sets up PyTorch's side, which only --vs-torch runs: add \
             --vs-torch\n{USAGE}"
        ));
    }
    if options.gpu && kiln_device::testing::cuda_required() {
        // The GPU run (run.sh sets KILN_REQUIRE_CUDA=1): GPU cases that skip would pass for
        // a run that measured nothing.
        if let Some(reason) = kiln_device::cuda_status().reason() {
            return Err(format!(
                "{}=1 but CUDA is unavailable: {reason}",
                kiln_device::testing::REQUIRE_CUDA_VAR
            ));
        }
    }
    if selected.is_empty() {
        selected = GROUPS.to_vec();
    }
    let mut rows = Vec::new();
    for (name, group) in selected {
        eprintln!(
            "bench: running group `{name}`{}",
            if options.quick { " (quick)" } else { "" }
        );
        rows.extend(group(&options).map_err(|e| format!("group `{name}`: {e}"))?);
    }
    let table = markdown(&rows);
    println!("{table}");
    let dir = match std::env::var_os("KILN_BENCH_OUT") {
        Some(out) if !out.is_empty() => PathBuf::from(out),
        _ => crate::paths::target_dir(&crate::paths::workspace_root()).join("kiln-bench"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
    for (file, text) in [("report.json", json), ("report.md", table)] {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    eprintln!("bench: wrote {}/report.{{json,md}}", dir.display());
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.metric == FAILED)
        .map(|r| r.case.as_str())
        .collect();
    if !failed.is_empty() {
        return Err(format!(
            "{} case(s) failed (their rows say why): {}",
            failed.len(),
            failed.join("; ")
        ));
    }
    Ok(())
}

fn group_names() -> String {
    GROUPS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Formats a figure with about four significant digits.
fn figure(v: f64) -> String {
    if v == 0.0 || (v.abs() >= 0.01 && v.abs() < 1e6) {
        let digits = if v.abs() >= 100.0 {
            1
        } else if v.abs() >= 10.0 {
            2
        } else {
            3
        };
        format!("{v:.digits$}")
    } else {
        format!("{v:.3e}")
    }
}

fn markdown(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| group | case | metric | value | reference | ratio |");
    let _ = writeln!(s, "|---|---|---|---:|---|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.group,
            r.case,
            r.metric,
            figure(r.value),
            r.reference,
            figure(r.ratio)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_row_reports_null_figures_and_the_error() {
        let json = serde_json::to_value(Row::failed("clip", "gpu x", "no memory")).unwrap();
        assert_eq!(json["metric"], FAILED);
        assert!(json["value"].is_null() && json["ratio"].is_null(), "{json}");
        assert_eq!(json["reference"], "error: no memory");
        assert!(markdown(&[Row::failed("clip", "gpu x", "e")]).contains("| failed | NaN |"));
    }

    #[test]
    fn steady_malloc_without_vs_torch_is_refused_before_any_group_runs() {
        let err = run(&["alloc".into(), "--torch-steady-malloc".into()]).unwrap_err();
        assert!(err.contains("add --vs-torch"), "{err}");
    }
}
