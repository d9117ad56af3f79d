//! The pieces every benchmark group is built from, written once: the row and option types, the
//! error conversion, the
//! CPU timers (one warm-up call, then the best or the median of the timed calls), the rows of
//! the memory-bandwidth reference, and the run of a group's CPU cases then its CUDA ones (an
//! error in the CUDA ones becoming a failed row).
//!
//! Invariants: every timer makes exactly one untimed warm-up call before timing, stops at the
//! first error, and returns seconds per call; a group's CUDA cases never run with `--gpu` off,
//! and its CPU cases never run with `--gpu-only`.

use serde::Serialize;
use std::time::Instant;

/// One measured figure.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Benchmark group (`alloc`, `clip`, ...).
    pub group: String,
    /// What was measured within the group.
    pub case: String,
    /// Unit or name of the figure.
    pub metric: String,
    /// kiln's figure.
    pub value: f64,
    /// What it is compared with.
    pub reference: String,
    /// kiln against the reference; >= 1 means kiln is better.
    pub ratio: f64,
}

impl Row {
    /// A row of `group`.
    pub fn new(
        group: &str,
        case: impl Into<String>,
        metric: &str,
        value: f64,
        reference: impl Into<String>,
        ratio: f64,
    ) -> Self {
        Self {
            group: group.to_string(),
            case: case.into(),
            metric: metric.to_string(),
            value,
            reference: reference.into(),
            ratio,
        }
    }
}

/// The metric of a row whose case could not be measured (see [`Row::failed`]).
pub const FAILED: &str = "failed";

impl Row {
    /// A case that could not be measured: metric [`FAILED`], value and ratio NaN (`null` in
    /// report.json) and the error as the reference. The other cases still run; `bench` writes
    /// the report, then exits with an error naming the failed cases.
    pub fn failed(group: &str, case: impl Into<String>, error: &str) -> Self {
        Row::new(
            group,
            case,
            FAILED,
            f64::NAN,
            format!("error: {error}"),
            f64::NAN,
        )
    }
}

/// Flags every group sees.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Keep the run short (CI smoke test): fewer iterations, same cases.
    pub quick: bool,
    /// Also run the cases that need a CUDA device.
    pub gpu: bool,
    /// Run only the cases that need a CUDA device (implies `gpu`).
    pub gpu_only: bool,
    /// Also run the CPU cases in PyTorch in the same run and add kiln/PyTorch rows.
    pub vs_torch: bool,
    /// Run PyTorch's interpreters with glibc keeping freed memory (`torch.rs`,
    /// [`TORCH_STEADY_MALLOC`](super::torch::TORCH_STEADY_MALLOC)).
    pub torch_steady_malloc: bool,
}

/// An error of any crate as the bench's `String` error.
pub fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Seconds of one call of `f`.
pub fn seconds(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

/// Sorted seconds of `runs` calls of `f` after one warm-up call; the warm-up's seconds too.
fn samples(
    runs: impl FnOnce(f64) -> usize,
    f: &mut impl FnMut() -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let start = Instant::now();
    f()?;
    let warm = start.elapsed().as_secs_f64();
    let runs = runs(warm);
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t)
}

/// Seconds of the fastest of `reps` calls of `f`, after one warm-up call.
pub fn best_of(reps: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let t = samples(|_| reps, &mut f)?;
    Ok(t.first().copied().unwrap_or(f64::INFINITY))
}

/// Median seconds of `runs` calls of `f` (at least one) after one warm-up call.
pub fn median_of(runs: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let t = samples(|_| runs.max(1), &mut f)?;
    Ok(t[t.len() / 2])
}

/// Median seconds of at least `reps` calls of `f` after one warm-up call; fast cases run more
/// often (up to about 0.3 s of samples, at most 200 calls) so the median is stable.
pub fn median_secs(reps: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let adaptive = |warm: f64| ((0.3 / warm.max(1e-6)) as usize).clamp(reps.max(1), 200);
    let t = samples(adaptive, &mut f)?;
    Ok(t[t.len() / 2])
}

/// `n` f32 values `value(i)` in a block of kiln's CPU allocator: the arrays of a bandwidth
/// reference pass. They must live where tensors do: the allocator advises its segments of
/// 2 MiB and more to use transparent huge pages, and on a VM (nested page tables) a pass over
/// huge pages can run at twice the bandwidth of the same pass over a `Vec`'s 4 KiB pages, so a
/// `Vec` reference would understate the limit of every tensor op it bounds.
pub fn host_array(
    n: usize,
    value: impl Fn(usize) -> f32,
) -> Result<kiln_device::HostBuffer<f32>, String> {
    kiln_device::HostBuffer::try_filled_with(n, 0.0, |a| {
        a.iter_mut().enumerate().for_each(|(i, x)| *x = value(i))
    })
    .map_err(|e| format!("bandwidth reference arrays: {e}"))
}

/// The two rows of the host memory-bandwidth reference measured this run (`read_bw` of a read
/// pass, `copy_bw` of a copy pass counting read and write bytes, both in bytes/s).
pub fn bandwidth_rows(group: &str, read_bw: f64, copy_bw: f64) -> [Row; 2] {
    [
        Row::new(
            group,
            "memory bandwidth: read pass",
            "GB/s",
            read_bw / 1e9,
            "measured this run",
            1.0,
        ),
        Row::new(
            group,
            "memory bandwidth: copy pass (R+W)",
            "GB/s",
            copy_bw / 1e9,
            "measured this run",
            1.0,
        ),
    ]
}

/// A group's rows: its CPU cases (unless `--gpu-only`), then, with `--gpu`, what its CUDA
/// cases add (they report their own failures as rows).
pub fn cpu_then_gpu(
    options: &Options,
    cpu_cases: fn(&Options) -> Result<Vec<Row>, String>,
    gpu_cases: fn(&Options, &mut Vec<Row>),
) -> Result<Vec<Row>, String> {
    let mut rows = if options.gpu_only {
        Vec::new()
    } else {
        cpu_cases(options)?
    };
    if options.gpu {
        gpu_cases(options, &mut rows);
    }
    Ok(rows)
}

/// Runs a group's `--gpu` cases into `rows`; an error that stops them becomes a
/// [`Row::failed`] row (and a line on stderr), so the rows of every group are still written.
pub fn gpu_cases(
    group: &str,
    options: &Options,
    rows: &mut Vec<Row>,
    cases: fn(&Options, &mut Vec<Row>) -> Result<(), String>,
) {
    if let Err(e) = cases(options, rows) {
        eprintln!("bench {group}: the --gpu cases stopped: {e}");
        rows.push(Row::failed(group, "gpu cases", &e));
    }
}

/// Op or node kinds by name, slowest first: name, calls per step and ms per step.
pub type ByName = Vec<(String, f64, f64)>;

/// A `kiln_autograd::OpProfile` list recorded over `steps` steps, as calls and ms per step.
pub fn per_step(list: Vec<kiln_autograd::NodeTime>, steps: usize) -> ByName {
    let steps = steps.max(1) as f64;
    list.into_iter()
        .map(|t| {
            let name = t.name.to_string();
            (name, t.calls as f64 / steps, t.seconds * 1e3 / steps)
        })
        .collect()
}

/// The `top` slowest kinds and the rest, one line: `ConvolutionBackward 120.3 ms (20x), ...,
/// others 3.0 ms`.
pub fn kinds_line(list: &ByName, top: usize) -> String {
    let mut parts: Vec<String> = list
        .iter()
        .take(top)
        .map(|(name, calls, ms)| format!("{name} {ms:.1} ms ({calls:.0}x)"))
        .collect();
    if list.len() > top {
        let rest: f64 = list.iter().skip(top).map(|n| n.2).sum();
        parts.push(format!("others {rest:.1} ms"));
    }
    parts.join(", ")
}

/// ms per step inside the listed kinds.
pub fn kinds_ms(list: &ByName) -> f64 {
    list.iter().map(|n| n.2).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_warm_up_once_and_time_the_asked_calls() {
        let mut calls = 0;
        best_of(3, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 4);
        calls = 0;
        median_of(5, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 6);
        let mut calls = 0;
        let failed = median_secs(2, || {
            calls += 1;
            if calls == 2 {
                Err("second call".into())
            } else {
                Ok(())
            }
        });
        assert_eq!(failed, Err("second call".to_string()));
    }
}
