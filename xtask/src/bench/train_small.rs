//! The `train` group's cases for the train example's model: the CIFAR ResNet of width 16 with
//! one block per stage (`cargo run --release --example train`'s default), a training step (SGD
//! momentum + clip, as the ResNet-18 cases) and an eval forward at batch 128. Its channels
//! (16 to 128) are few next to the batch, so the convolutions' copies (padding, im2col, the
//! chunked path's gathers) weigh more than in ResNet-18; with `--vs-torch`, both figures get
//! rows against PyTorch's same model (`torch_bench.py`'s `small_resnet_*`, in a PyTorch process
//! of their own). A file apart from `train.rs`, whose helpers it uses; `mod.rs` runs both as the
//! `train` group.

use super::harness::{err, median_of, Options, Row};
use super::torch::{Figure, Pairs};
use super::train::{fresh_start, labels, train_step, GROUP};
use kiln_autograd::{no_grad, DType, Device, Module, Tensor};
use kiln_models::models::{BlockKind, ResNet, ResNetConfig, ResNetDims};
use kiln_models::Layer;
use kiln_optim::{ParamGroup, Sgd, SgdOptions};
use std::hint::black_box;

const CPU: Device = Device::Cpu;
const NAME: &str = "CIFAR ResNet, width 16, one block per stage (the train example's)";

fn small_resnet() -> Result<ResNet, String> {
    let config = ResNetConfig {
        block: BlockKind::Basic,
        layers: [1, 1, 1, 1],
        num_classes: 10,
        small_input: true,
    };
    let dims = ResNetDims {
        width: 16,
        in_channels: 3,
    };
    ResNet::with_dims(config, dims).map_err(err)
}

/// The `train` group's cases after `train::run`'s (see `mod.rs`).
pub(super) fn run(options: &Options) -> Result<Vec<Row>, String> {
    if options.gpu_only {
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    let mut pairs = Pairs::new(GROUP, options);
    step_and_eval(options, &mut rows, &mut pairs)?;
    rows.extend(pairs.into_rows());
    Ok(rows)
}

/// The step and eval rows at `batch` (8 with `--quick`, else 128).
fn step_and_eval(options: &Options, rows: &mut Vec<Row>, pairs: &mut Pairs) -> Result<(), String> {
    let batch = if options.quick { 8 } else { 128 };
    let runs = if options.quick { 2 } else { 10 };
    let mut out = Timed {
        rows,
        pairs,
        batch,
        runs,
    };
    fresh_start()?;
    let model = small_resnet()?;
    let params = model.named_parameters();
    let mut opt = Sgd::new(
        vec![ParamGroup::new(params.clone())],
        SgdOptions::default().lr(0.01).momentum(0.9),
    )
    .map_err(err)?;
    let x = Tensor::randn(&[batch, 3, 32, 32], DType::F32, CPU).map_err(err)?;
    let y = labels(batch, 10)?;
    let step = || train_step(&model, &params, &mut opt, &x, &y);
    out.case("step", "SGD momentum + clip: step time", step)?;

    fresh_start()?;
    let mut model = small_resnet()?;
    model.eval();
    let forward = || no_grad(|| black_box(model.forward(&x)).map(drop).map_err(err));
    out.case("eval", "eval under no_grad: forward time", forward)
}

/// Where the cases' figures go, and how they are taken.
struct Timed<'a> {
    rows: &'a mut Vec<Row>,
    pairs: &'a mut Pairs,
    batch: usize,
    runs: usize,
}

impl Timed<'_> {
    /// `run` once to warm up, then its median ms over `runs` calls: a row, and with
    /// `--vs-torch` one against `torch_bench.py`'s `small_resnet_{what}`.
    fn case(
        &mut self,
        what: &str,
        label: &str,
        mut run: impl FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        let (batch, runs) = (self.batch, self.runs);
        run()?;
        let ms = median_of(runs, &mut run)? * 1e3;
        eprintln!("bench train: {NAME}, batch {batch}, {what}: {ms:.2} ms");
        self.rows.push(Row::new(
            GROUP,
            format!("{NAME} 32x32, batch {batch}, {label}"),
            "ms",
            ms,
            "images per second (ratio = images/s)",
            batch as f64 * 1e3 / ms,
        ));
        let id = format!("small_resnet_{what}/{batch}");
        self.pairs.add(
            &format!("train example's ResNet {what} ({id})"),
            &id,
            Figure::Millis,
            ms,
            || Ok(median_of(runs, &mut run)? * 1e3),
        )
    }
}
