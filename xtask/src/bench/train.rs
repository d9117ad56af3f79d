//! The `train` benchmark group (issue 9): whole training steps on the CPU, as an application
//! runs them, and the memory those steps take.
//!
//! Two steps, each `forward -> loss -> backward -> optimizer step -> zero_grad(true)`:
//! - `mlp`: 784-512-256-10 MLP, batch 128 (quick: 32), `cross_entropy`, AdamW;
//! - `resnet18`: ResNet-18 with the CIFAR-style stem (3x3 stride-1 first conv, no max-pool) on
//!   32x32 images, batch 32 (quick: 4), `cross_entropy`, SGD with momentum and
//!   `clip_grad_norm_(max_norm = 1)` before the step.
//!
//! Per step, three rows:
//! - step time (median of several steps after a warm-up one), against kiln's own f32 matmul
//!   rate measured in this group (512x512x512, best of a few): `ratio` is the step's achieved
//!   GFLOP/s over that rate, i.e. the fraction of dense-matmul speed a whole step reaches. The
//!   step's FLOPs are 3 x 2 x the forward's multiply-adds from `kiln_models::summary` (forward
//!   plus the two backward products), the usual estimate; elementwise work, norms and the
//!   optimizer are not counted.
//! - `max_memory_allocated` over one steady-state step (after `reset_peak_memory_stats`, less
//!   what was allocated before the model was built), against `kiln_models::plan`'s predicted
//!   peak for that batch: `ratio` is predicted / measured (1 = the plan is exact).
//! - `max_memory_reserved` over the same step, against the allocated peak: `ratio` is
//!   allocated / reserved, the share of the cached segments that held live tensors at the peak.
//!
//! The CPU caching allocator is process-wide, so the group empties the cache before each case
//! and subtracts what is still allocated at that point from the allocated peak (the reserved
//! figure is the allocator's total).

use super::harness::{best_of, err, median_of, Options, Row};
use kiln_autograd::{manual_seed, DType, Device, Generator, Module, Tensor};
use kiln_device::{
    empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
    reset_peak_memory_stats,
};
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use kiln_models::models::{mlp, BlockKind, ResNet, ResNetConfig};
use kiln_models::{plan, summary, Layer, OptimizerKind};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, Sgd, SgdOptions};
use std::hint::black_box;

const GROUP: &str = "train";
const CPU: Device = Device::Cpu;

/// Runs every case of the group.
pub fn run(options: &Options) -> Result<Vec<Row>, String> {
    if options.gpu_only {
        // No CUDA cases in this group yet.
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    let matmul_rate = matmul_gflops(options)?;
    eprintln!("bench train: reference matmul 512: {matmul_rate:.2} GFLOP/s");
    let (mlp_batch, resnet_batch) = if options.quick { (32, 4) } else { (128, 32) };
    mlp_step(options, mlp_batch, matmul_rate, &mut rows)?;
    resnet_step(options, resnet_batch, matmul_rate, &mut rows)?;
    if options.gpu {
        eprintln!(
            "bench train: --gpu: this group measures CPU steps; the CUDA training step (ResNet18, \
             bf16 autocast) is `cargo xtask bench ops --gpu` (gpu resnet18 row)"
        );
    }
    Ok(rows)
}

/// kiln's f32 matmul rate at 512x512x512 through `Tensor::matmul`, best of a few runs.
fn matmul_gflops(options: &Options) -> Result<f64, String> {
    let n = 512;
    let mut generator = Generator::new(1);
    let a = generator
        .normal(&[n, n], 0.0, 1.0, DType::F32, CPU)
        .map_err(err)?;
    let b = generator
        .normal(&[n, n], 0.0, 1.0, DType::F32, CPU)
        .map_err(err)?;
    let reps = if options.quick { 2 } else { 10 };
    let best = best_of(reps, || {
        black_box(a.matmul(&b).map_err(err)?);
        Ok(())
    })?;
    Ok(2.0 * (n * n * n) as f64 / best / 1e9)
}

/// Class-index targets in `[0, classes)` (a fixed pattern; the step time does not depend on it).
fn labels(batch: usize, classes: usize) -> Result<Tensor, String> {
    let v: Vec<i64> = (0..batch).map(|i| ((i * 7 + 3) % classes) as i64).collect();
    Tensor::from_vec(v, &[batch], CPU).map_err(err)
}

/// What one case measured.
struct Measured {
    case: String,
    step_secs: f64,
    step_flops: f64,
    peak_allocated: usize,
    peak_reserved: usize,
    planned_peak: usize,
}

fn push_rows(m: &Measured, matmul_rate: f64, rows: &mut Vec<Row>) {
    let achieved = m.step_flops / m.step_secs / 1e9;
    eprintln!(
        "bench train: {}: {:.1} ms/step, {achieved:.2} GFLOP/s, peak allocated {} B, reserved {} B, planned {} B",
        m.case,
        m.step_secs * 1e3,
        m.peak_allocated,
        m.peak_reserved,
        m.planned_peak
    );
    rows.push(Row::new(
        GROUP,
        format!("{}: step time", m.case),
        "ms",
        m.step_secs * 1e3,
        format!(
            "step at {achieved:.2} GFLOP/s ({:.3} GFLOP/step) vs kiln matmul 512 this run: \
             {matmul_rate:.2} GFLOP/s",
            m.step_flops / 1e9
        ),
        achieved / matmul_rate,
    ));
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    rows.push(Row::new(
        GROUP,
        format!("{}: max_memory_allocated", m.case),
        "MiB",
        mib(m.peak_allocated),
        format!(
            "kiln_models::plan peak: {:.2} MiB (ratio = plan / measured)",
            mib(m.planned_peak)
        ),
        m.planned_peak as f64 / m.peak_allocated as f64,
    ));
    rows.push(Row::new(
        GROUP,
        format!("{}: max_memory_reserved", m.case),
        "MiB",
        mib(m.peak_reserved),
        "peak allocated (ratio = allocated / reserved)",
        m.peak_allocated as f64 / m.peak_reserved as f64,
    ));
}

/// Runs `step` once to reach the steady state (gradients and optimizer state exist), then
/// measures one step's peaks above `base`, then times `steps` more: the figures of `case`, a
/// step of `step_flops` whose memory plan predicts `planned_peak`.
fn measure(
    case: String,
    step_flops: f64,
    planned_peak: usize,
    steps: usize,
    base: usize,
    mut step: impl FnMut() -> Result<(), String>,
) -> Result<Measured, String> {
    step()?;
    reset_peak_memory_stats(CPU).map_err(err)?;
    step()?;
    let peak_allocated = max_memory_allocated(CPU).map_err(err)? - base;
    let peak_reserved = max_memory_reserved(CPU).map_err(err)?;
    let step_secs = median_of(steps, step)?;
    Ok(Measured {
        case,
        step_secs,
        step_flops,
        peak_allocated,
        peak_reserved,
        planned_peak,
    })
}

/// Seeds kiln's generator with 0 and empties the CPU cache; returns the bytes still allocated,
/// the base a case's peaks are measured above.
fn fresh_start() -> Result<usize, String> {
    manual_seed(0);
    empty_cache(CPU).map_err(err)?;
    memory_allocated(CPU).map_err(err)
}

fn mlp_step(
    options: &Options,
    batch: usize,
    matmul_rate: f64,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let base = fresh_start()?;
    let model = mlp(&[784, 512, 256, 10], 0.0).map_err(err)?;
    let s = summary(&model, &[batch, 784]).map_err(err)?;
    let planned = plan(&model, &[784], DType::F32, OptimizerKind::AdamW)
        .map_err(err)?
        .peak_allocated_bytes(batch);
    let mut opt = AdamW::new(
        vec![ParamGroup::from_module(&model)],
        AdamOptions::adamw().lr(1e-3),
    )
    .map_err(err)?;
    let x = Tensor::randn(&[batch, 784], DType::F32, CPU).map_err(err)?;
    let y = labels(batch, 10)?;
    let ce = CrossEntropyOptions::default();
    let steps = if options.quick { 3 } else { 30 };
    let case = format!("mlp 784-512-256-10, batch {batch}, AdamW");
    let flops = 6.0 * s.total_mult_adds as f64;
    let measured = measure(case, flops, planned, steps, base, || {
        let loss = cross_entropy(&model.forward(&x).map_err(err)?, &y, &ce).map_err(err)?;
        loss.backward().map_err(err)?;
        opt.step().map_err(err)?;
        opt.zero_grad(true).map_err(err)
    })?;
    push_rows(&measured, matmul_rate, rows);
    Ok(())
}

fn resnet_step(
    options: &Options,
    batch: usize,
    matmul_rate: f64,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    let base = fresh_start()?;
    let model = ResNet::new(ResNetConfig {
        block: BlockKind::Basic,
        layers: [2, 2, 2, 2],
        num_classes: 10,
        small_input: true,
    })
    .map_err(err)?;
    let s = summary(&model, &[batch, 3, 32, 32]).map_err(err)?;
    let planned = plan(&model, &[3, 32, 32], DType::F32, OptimizerKind::SgdMomentum)
        .map_err(err)?
        .peak_allocated_bytes(batch);
    let params = model.named_parameters();
    let mut opt = Sgd::new(
        vec![ParamGroup::new(params.clone())],
        SgdOptions::default().lr(0.01).momentum(0.9),
    )
    .map_err(err)?;
    let x = Tensor::randn(&[batch, 3, 32, 32], DType::F32, CPU).map_err(err)?;
    let y = labels(batch, 10)?;
    let ce = CrossEntropyOptions::default();
    let steps = if options.quick { 1 } else { 5 };
    let case = format!("resnet18 (CIFAR stem) 32x32, batch {batch}, SGD momentum + clip");
    let flops = 6.0 * s.total_mult_adds as f64;
    let measured = measure(case, flops, planned, steps, base, || {
        let loss = cross_entropy(&model.forward(&x).map_err(err)?, &y, &ce).map_err(err)?;
        loss.backward().map_err(err)?;
        kiln_optim::clip_grad_norm_(&params, 1.0, 2.0, false).map_err(err)?;
        opt.step().map_err(err)?;
        opt.zero_grad(true).map_err(err)
    })?;
    push_rows(&measured, matmul_rate, rows);
    Ok(())
}
