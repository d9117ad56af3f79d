//! Shared by the DDP and ZeRO tests: deterministic models, batches, optimizers and runners.
#![allow(dead_code)]

use kiln_autograd::{no_grad, Device, Module, Tensor};
use kiln_losses::{mse_loss, Reduction};
use kiln_models::layers::{BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, ReLU, Sequential};
use kiln_models::{Layer, LayerExt};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, Sgd, SgdOptions};

/// Sets every parameter to a fixed pattern shifted by `offset` (ranks other than 0 pass a
/// non-zero offset so that only DDP's broadcast makes them agree).
pub fn init(model: &dyn Module, offset: f64) {
    for (i, p) in model.parameters().iter().enumerate() {
        let n = p.numel();
        let scale = 1.0 / (n as f64).sqrt().max(1.0) * 3.0;
        let v: Vec<f32> = (0..n)
            .map(|k| ((0.37 * k as f64 + 1.3 * i as f64).sin() * scale + offset) as f32)
            .collect();
        let src = Tensor::from_vec(v, p.shape(), Device::Cpu).unwrap();
        no_grad(|| p.copy_(&src)).unwrap();
    }
}

/// A 4 -> 16 -> 8 -> 3 MLP.
pub fn mlp() -> Sequential {
    kiln_models::models::mlp(&[4, 16, 8, 3], 0.0).unwrap()
}

/// Conv(2 -> 4, 3x3, pad 1) -> BatchNorm2d -> ReLU -> Flatten -> Linear(4*4*4 -> 3), on 4x4 images.
pub fn conv_bn() -> Sequential {
    let cfg = Conv2dConfig {
        padding: [1, 1],
        ..Default::default()
    };
    Sequential::new()
        .push(Conv2d::new(2, 4, 3, cfg).unwrap())
        .push(BatchNorm2d::new(4).unwrap())
        .push(ReLU::new())
        .push(Flatten::new())
        .push(Linear::new(64, 3, true).unwrap())
}

/// Step `step`'s inputs and targets: `rows` rows of `sample_shape`, and `[rows, 3]` targets.
pub fn batch(step: usize, rows: usize, sample_shape: &[usize]) -> (Tensor, Tensor) {
    let per: usize = sample_shape.iter().product();
    let x: Vec<f32> = (0..rows * per)
        .map(|k| ((k as f64 * 0.71 + step as f64 * 2.3).cos() * 1.5) as f32)
        .collect();
    let y: Vec<f32> = (0..rows * 3)
        .map(|k| ((k as f64 * 1.13 + step as f64 * 0.7).sin()) as f32)
        .collect();
    let mut shape = vec![rows];
    shape.extend_from_slice(sample_shape);
    (
        Tensor::from_vec(x, &shape, Device::Cpu).unwrap(),
        Tensor::from_vec(y, &[rows, 3], Device::Cpu).unwrap(),
    )
}

/// Rows `part * rows .. (part + 1) * rows` of `t`.
pub fn rows(t: &Tensor, part: usize, rows: usize) -> Tensor {
    t.narrow(0, part * rows, rows)
        .unwrap()
        .contiguous()
        .unwrap()
}

pub fn loss(pred: &Tensor, target: &Tensor) -> Tensor {
    mse_loss(pred, target, Reduction::Mean).unwrap()
}

/// Which optimizer a run uses.
#[derive(Clone, Copy, Debug)]
pub enum Opt {
    SgdMomentum,
    AdamW,
}

pub fn optimizer(model: &dyn Module, opt: Opt) -> Box<dyn Optimizer> {
    let groups = vec![ParamGroup::from_module(model)];
    match opt {
        Opt::SgdMomentum => {
            Box::new(Sgd::new(groups, SgdOptions::default().lr(0.05).momentum(0.9)).unwrap())
        }
        Opt::AdamW => Box::new(AdamW::new(groups, AdamOptions::adamw().lr(0.01)).unwrap()),
    }
}

/// Every parameter and buffer as f64 values, in state-dict order.
pub fn state(model: &dyn Layer) -> Vec<(String, Vec<f64>)> {
    model
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec_f64().unwrap()))
        .collect()
}

/// The largest `|a - b| / (1 + |b|)` over two states, naming where it is.
pub fn max_rel_diff(a: &[(String, Vec<f64>)], b: &[(String, Vec<f64>)]) -> (f64, String) {
    assert_eq!(a.len(), b.len());
    let mut worst = (0.0, String::new());
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        for (x, y) in va.iter().zip(vb) {
            let d = (x - y).abs() / (1.0 + y.abs());
            if d > worst.0 {
                worst = (d, na.clone());
            }
        }
    }
    worst
}
