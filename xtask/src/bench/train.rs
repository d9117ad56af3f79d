//! The `train` benchmark group (issue 9): whole training steps on the CPU, as an application
//! runs them, and the memory those steps take.
//!
//! Three steps, each `forward -> loss -> backward -> clip_grad_norm_(max_norm = 1) -> optimizer
//! step -> zero_grad(true)`:
//! - `mlp`: 784-512-256-10 MLP, batch 128 (quick: 32), `cross_entropy`, AdamW;
//! - `resnet18` with the CIFAR-style stem (3x3 stride-1 first conv, no max-pool) on 32x32
//!   images, batch 32 (quick: 4), 10 classes, SGD with momentum;
//! - `resnet18` with torchvision's stem on 224x224 images, batch 8 (quick: 1), 1000 classes, SGD
//!   with momentum.
//!
//! More cases time without memory rows: ResNet-18 (224x224, 1000 classes) inference in eval
//! mode under `no_grad` at batch 1 and 3, and the CIFAR step while a busy competing process
//! (a shell loop) spins on one core, against the same step without it (`ratio` = quiet time /
//! contended time). With `--vs-torch` each case also gets a row against PyTorch's same case,
//! measured in the same run (`torch.rs`).
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
use super::torch::{Figure, Pairs, Spinner};
use kiln_autograd::{manual_seed, no_grad, DType, Device, Generator, Module, Tensor};
use kiln_device::{
    empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated,
    reset_peak_memory_stats,
};
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use kiln_models::models::{mlp, BlockKind, ResNet, ResNetConfig};
use kiln_models::{plan, summary, Layer, OptimizerKind};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, Sgd, SgdOptions};
use std::hint::black_box;

pub(super) const GROUP: &str = "train";
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
    let (mlp_batch, cifar_batch, big_batch) = if options.quick {
        (32, 4, 1)
    } else {
        (128, 32, 8)
    };
    let mut pairs = Pairs::new(GROUP, options);
    mlp_step(options, mlp_batch, matmul_rate, &mut rows, &mut pairs)?;
    let cifar = Resnet {
        size: 32,
        batch: cifar_batch,
    };
    let cifar_ms = resnet_step(options, cifar, matmul_rate, &mut rows, &mut pairs)?;
    let big = Resnet {
        size: 224,
        batch: big_batch,
    };
    resnet_step(options, big, matmul_rate, &mut rows, &mut pairs)?;
    for batch in [1, 3] {
        resnet_eval(options, batch, &mut rows, &mut pairs)?;
    }
    contended_step(options, cifar, cifar_ms, &mut rows, &mut pairs)?;
    rows.extend(pairs.into_rows());
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
pub(super) fn labels(batch: usize, classes: usize) -> Result<Tensor, String> {
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
    step: &mut impl FnMut() -> Result<(), String>,
) -> Result<Measured, String> {
    step()?;
    reset_peak_memory_stats(CPU).map_err(err)?;
    step()?;
    let peak_allocated = max_memory_allocated(CPU).map_err(err)? - base;
    let peak_reserved = max_memory_reserved(CPU).map_err(err)?;
    let step_secs = median_of(steps, &mut *step)?;
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
pub(super) fn fresh_start() -> Result<usize, String> {
    manual_seed(0);
    empty_cache(CPU).map_err(err)?;
    memory_allocated(CPU).map_err(err)
}

fn mlp_step(
    options: &Options,
    batch: usize,
    matmul_rate: f64,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
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
    let case = format!("mlp 784-512-256-10, batch {batch}, AdamW + clip");
    let flops = 6.0 * s.total_mult_adds as f64;
    let params = model.named_parameters();
    let mut step = || {
        let loss = cross_entropy(&model.forward(&x).map_err(err)?, &y, &ce).map_err(err)?;
        loss.backward().map_err(err)?;
        kiln_optim::clip_grad_norm_(&params, 1.0, 2.0, false).map_err(err)?;
        opt.step().map_err(err)?;
        opt.zero_grad(true).map_err(err)
    };
    let measured = measure(case, flops, planned, steps, base, &mut step)?;
    push_rows(&measured, matmul_rate, rows);
    let id = format!("mlp_step/{batch}");
    pairs.add(
        &format!("mlp step ({id})"),
        &id,
        Figure::Millis,
        measured.step_secs * 1e3,
        || Ok(median_of(steps, &mut step)? * 1e3),
    )
}

/// A ResNet-18 training case: image size (32: CIFAR stem and 10 classes; otherwise
/// torchvision's stem and 1000 classes) and batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resnet {
    pub size: usize,
    pub batch: usize,
}

impl Resnet {
    fn small_input(self) -> bool {
        self.size == 32
    }

    fn classes(self) -> usize {
        if self.small_input() {
            10
        } else {
            1000
        }
    }

    pub(super) fn model(self) -> Result<ResNet, String> {
        ResNet::new(ResNetConfig {
            block: BlockKind::Basic,
            layers: [2, 2, 2, 2],
            num_classes: self.classes(),
            small_input: self.small_input(),
        })
        .map_err(err)
    }

    fn name(self) -> String {
        let stem = if self.small_input() {
            "CIFAR stem"
        } else {
            "ImageNet stem"
        };
        format!(
            "resnet18 ({stem}) {0}x{0}, batch {1}, SGD momentum + clip",
            self.size, self.batch
        )
    }
}

/// One training step of `model` on `x`, `y` (see the module doc).
pub(super) fn train_step(
    model: &ResNet,
    params: &[(String, kiln_autograd::Parameter)],
    opt: &mut Sgd,
    x: &Tensor,
    y: &Tensor,
) -> Result<(), String> {
    let ce = CrossEntropyOptions::default();
    let loss = cross_entropy(&model.forward(x).map_err(err)?, y, &ce).map_err(err)?;
    loss.backward().map_err(err)?;
    kiln_optim::clip_grad_norm_(params, 1.0, 2.0, false).map_err(err)?;
    opt.step().map_err(err)?;
    opt.zero_grad(true).map_err(err)
}

/// A model, its parameters, an SGD-momentum optimizer and one batch (inputs, labels).
pub(super) type Setup = (
    ResNet,
    Vec<(String, kiln_autograd::Parameter)>,
    Sgd,
    Tensor,
    Tensor,
);

/// The [`Setup`] of `r`.
pub(super) fn resnet_setup(r: Resnet) -> Result<Setup, String> {
    let model = r.model()?;
    let params = model.named_parameters();
    let opt = Sgd::new(
        vec![ParamGroup::new(params.clone())],
        SgdOptions::default().lr(0.01).momentum(0.9),
    )
    .map_err(err)?;
    let x = Tensor::randn(&[r.batch, 3, r.size, r.size], DType::F32, CPU).map_err(err)?;
    let y = labels(r.batch, r.classes())?;
    Ok((model, params, opt, x, y))
}

fn resnet_step(
    options: &Options,
    r: Resnet,
    matmul_rate: f64,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<f64, String> {
    let base = fresh_start()?;
    let input = [3, r.size, r.size];
    let (model, params, mut opt, x, y) = resnet_setup(r)?;
    let s = summary(&model, &[r.batch, 3, r.size, r.size]).map_err(err)?;
    let planned = plan(&model, &input, DType::F32, OptimizerKind::SgdMomentum)
        .map_err(err)?
        .peak_allocated_bytes(r.batch);
    let steps = if options.quick { 1 } else { 5 };
    let flops = 6.0 * s.total_mult_adds as f64;
    let mut step = || train_step(&model, &params, &mut opt, &x, &y);
    let measured = measure(r.name(), flops, planned, steps, base, &mut step)?;
    push_rows(&measured, matmul_rate, rows);
    let ms = measured.step_secs * 1e3;
    let (name, size) = if r.small_input() {
        ("resnet18_cifar_step", "32x32")
    } else {
        ("resnet18_224_step", "224x224")
    };
    let id = format!("{name}/{}", r.batch);
    pairs.add(
        &format!("resnet18 {size} step ({id})"),
        &id,
        Figure::Millis,
        ms,
        || Ok(median_of(steps, &mut step)? * 1e3),
    )?;
    Ok(ms)
}

/// ResNet-18 at 224x224 (1000 classes) in eval mode and a random input of `batch` images: the
/// eval cases of this group and of the `threads` group's children.
pub(super) fn eval_setup(batch: usize) -> Result<(ResNet, Tensor), String> {
    let mut model = Resnet { size: 224, batch }.model()?;
    model.eval();
    let x = Tensor::randn(&[batch, 3, 224, 224], DType::F32, CPU).map_err(err)?;
    Ok((model, x))
}

/// One forward of `model` on `x` under `no_grad`, its output dropped.
pub(super) fn eval_forward(model: &ResNet, x: &Tensor) -> Result<(), String> {
    no_grad(|| black_box(model.forward(x)).map(drop).map_err(err))
}

/// ResNet-18 (224x224, 1000 classes) forward in eval mode under `no_grad` at `batch`: median
/// ms. Batch 1 spreads each image over the pool; batch 3 on two threads leaves one image past
/// the pool's whole round (and is smaller than larger pools).
fn resnet_eval(
    options: &Options,
    batch: usize,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<(), String> {
    fresh_start()?;
    let (model, x) = eval_setup(batch)?;
    let runs = if options.quick { 3 } else { 20 };
    let mut forward = || eval_forward(&model, &x);
    let ms = median_of(runs, &mut forward)? * 1e3;
    eprintln!("bench train: resnet18 224x224 batch {batch} eval: {ms:.2} ms");
    rows.push(Row::new(
        GROUP,
        format!(
            "resnet18 (ImageNet stem) 224x224, batch {batch}, eval under no_grad: forward time"
        ),
        "ms",
        ms,
        "images per second (ratio = images/s)",
        batch as f64 * 1e3 / ms,
    ));
    let id = format!("resnet18_224_eval/{batch}");
    pairs.add(
        &format!("resnet18 224x224 batch {batch} eval ({id})"),
        &id,
        Figure::Millis,
        ms,
        || Ok(median_of(runs, &mut forward)? * 1e3),
    )
}

/// The step of `r` while a competing process spins on one core: median ms, and a row against
/// the quiet step time `quiet_ms` measured before.
fn contended_step(
    options: &Options,
    r: Resnet,
    quiet_ms: f64,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<(), String> {
    fresh_start()?;
    let (model, params, mut opt, x, y) = resnet_setup(r)?;
    let steps = if options.quick { 1 } else { 3 };
    let mut contended = || {
        let _spinner = Spinner::start()?;
        Ok(median_of(steps, || train_step(&model, &params, &mut opt, &x, &y))? * 1e3)
    };
    let ms = contended()?;
    eprintln!("bench train: {}, one core busy: {ms:.1} ms/step", r.name());
    rows.push(Row::new(
        GROUP,
        format!("{}, one core busy (competing process): step time", r.name()),
        "ms",
        ms,
        format!("same step without it: {quiet_ms:.1} ms (ratio = quiet / contended)"),
        quiet_ms / ms,
    ));
    let id = format!("resnet18_cifar_step_contended/{}", r.batch);
    pairs.add(
        &format!("resnet18 32x32 step, one core busy ({id})"),
        &id,
        Figure::Millis,
        ms,
        contended,
    )
}
