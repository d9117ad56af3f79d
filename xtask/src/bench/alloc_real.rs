//! The `alloc` group's real runs: kiln's recorded training runs trained for real on the CPU
//! (`cargo xtask record-traces --peaks`, one child process per allocator setting, since the
//! CPU allocator reads `KILN_ALLOC_CONF` once per process), with the kernels' worker threads,
//! the passes on the CPU pool and every step marked. Where the replays of the recorded traces
//! are the figures of record, these show the same settings at work in a process as users run
//! it: peak reserved over peak allocated bytes of the CPU allocator, and the planned steps
//! served.

use super::harness::{Options, Row};
use std::process::Command;

const GROUP: &str = "alloc";

/// What one child run printed: peak reserved and allocated bytes, steps planned and fallen
/// back, and scratch blocks lent the plan's idle memory.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Peaks {
    reserved: f64,
    allocated: f64,
    planned: u64,
    fallen_back: u64,
    lent: u64,
}

impl Peaks {
    fn ratio(&self) -> f64 {
        self.reserved / self.allocated.max(1.0)
    }
}

/// Reads the line `NAME: peak reserved R B / peak allocated A B = X; planned steps P, fallen
/// back F, blocks placed N, scratch blocks lent L, displaced D`.
fn parse(line: &str) -> Option<Peaks> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |label: &str| -> Option<f64> {
        let at = words.windows(2).position(|w| w.join(" ") == label)?;
        words.get(at + 2)?.trim_end_matches(',').parse().ok()
    };
    Some(Peaks {
        reserved: after("peak reserved")?,
        allocated: after("peak allocated")?,
        planned: after("planned steps")? as u64,
        fallen_back: after("fallen back")? as u64,
        lent: after("blocks lent")? as u64,
    })
}

/// Trains run `name` in a child with `conf` as `KILN_ALLOC_CONF` (none: unset), on `threads`
/// threads (none: the default).
fn child(name: &str, conf: Option<&str>, threads: Option<usize>) -> Result<Peaks, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the xtask binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["record-traces", "--peaks", "--only", name]);
    if let Some(n) = threads {
        cmd.env("KILN_NUM_THREADS", n.to_string());
    }
    match conf {
        Some(c) => cmd.env("KILN_ALLOC_CONF", c),
        None => cmd.env_remove("KILN_ALLOC_CONF"),
    };
    let out = cmd
        .output()
        .map_err(|e| format!("record-traces --peaks: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with(&format!("{name}: ")));
    match (out.status.success(), line.and_then(parse)) {
        (true, Some(peaks)) => Ok(peaks),
        _ => Err(format!(
            "record-traces --peaks --only {name} (KILN_ALLOC_CONF={conf:?}) failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// The settings compared, each with its target: PyTorch's default (fixed segments), planned
/// steps on it, and expandable segments with page stitching on the host backend's pages.
const SETTINGS: [(&str, Option<&str>, f64); 3] = [
    ("default", None, 1.10),
    ("planned_steps", Some("planned_steps:True"), 1.10),
    (
        "expandable_page_stitching",
        Some("expandable_segments:True,page_stitching:True"),
        1.03,
    ),
];

/// One row per run and setting: the CPU-scale fixed-shape ResNet-18 run only with `--quick`,
/// kiln's four CPU-scale runs otherwise.
pub(super) fn real_runs(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    let runs: &[&str] = if options.quick {
        &["resnet18_sgd"]
    } else {
        &[
            "resnet18_sgd",
            "gpt_varlen_adamw",
            "finetune_resnet18_varbatch",
            "vit_adamw",
        ]
    };
    let threads = kiln_device::threads::num_threads();
    for name in runs {
        let mut without_plan = None;
        for (setting, conf, target) in SETTINGS {
            let p = child(name, conf, None)?;
            let plan = match without_plan {
                Some(plain) if setting == "planned_steps" => format!(
                    "; without a plan {plain:.3}; steps planned {}, fallen back {}",
                    p.planned, p.fallen_back
                ),
                _ => String::new(),
            };
            without_plan.get_or_insert(p.ratio());
            rows.push(Row::new(
                GROUP,
                format!("{name}_real_run_{setting}"),
                "reserved_over_allocated",
                p.ratio(),
                format!(
                    "target <= {target}; trained on the CPU, {threads} threads, peak reserved / \
                     peak allocated{plan}"
                ),
                target / p.ratio(),
            ));
        }
    }
    oversubscribed(threads, rows)
}

/// Planned steps with four times as many threads as the default, where the convolutions'
/// scratch (one piece per task in flight) outgrows the cache beside the plan and borrows the
/// plan's idle memory (before it could, a plan cost memory there: 1.157 against 1.049).
fn oversubscribed(threads: usize, rows: &mut Vec<Row>) -> Result<(), String> {
    let (name, many) = ("resnet18_sgd", threads.saturating_mul(4).max(2));
    let plain = child(name, None, Some(many))?;
    let planned = child(name, Some("planned_steps:True"), Some(many))?;
    rows.push(Row::new(
        GROUP,
        format!("{name}_real_run_planned_steps_oversubscribed"),
        "reserved_over_allocated",
        planned.ratio(),
        format!(
            "target <= without a plan ({:.3}); trained on the CPU, {many} threads; steps planned \
             {}, fallen back {}, scratch blocks lent {}",
            plain.ratio(),
            planned.planned,
            planned.fallen_back,
            planned.lent
        ),
        plain.ratio() / planned.ratio(),
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_peaks_line() {
        let line = "vit_adamw: peak reserved 142606336 B / peak allocated 133484032 B = 1.068; \
                    planned steps 5, fallen back 0, blocks placed 2755, scratch blocks lent 40, \
                    displaced 0";
        let p = parse(line).unwrap();
        assert_eq!(
            p,
            Peaks {
                reserved: 142606336.0,
                allocated: 133484032.0,
                planned: 5,
                fallen_back: 0,
                lent: 40
            }
        );
        assert!((p.ratio() - 1.0683).abs() < 1e-4);
        assert_eq!(parse("vit_adamw: failed"), None);
    }
}
