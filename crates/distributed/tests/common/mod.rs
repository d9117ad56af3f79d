//! Shared by the DDP and ZeRO tests: deterministic models, batches, optimizers and runners.
#![allow(dead_code)]

use kiln_autograd::{no_grad, DType, Device, Module, Tensor};
use kiln_distributed::{DdpOptions, DistributedDataParallel, ProcessGroup};
use kiln_losses::{mse_loss, Reduction};
use kiln_models::layers::{BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, ReLU, Sequential};
use kiln_models::{Layer, LayerExt};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup, Sgd, SgdOptions};
use std::sync::Arc;

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

const DDP_STEPS: usize = 4;
const DDP_ROWS: usize = 3;

/// DDP of [`mlp`] on `group` (each rank on its rows of every batch, on `device`), checked on
/// every rank to end bit-identical to every other rank, and on rank 0 to end within
/// `tolerance` (relative) of one CPU process over the whole batches, after moving well beyond
/// it. Prints `rank R: ddp ranks agree` and, on rank 0, `rank 0: ddp matches one process`.
pub fn ddp_against_one_process(group: Arc<dyn ProcessGroup>, device: Device, tolerance: f64) {
    let rank = group.rank();
    let world = group.world_size();
    let model = mlp();
    init(&model, rank as f64); // only rank 0's values survive DDP's broadcast
    model.to_device(device).unwrap();
    let ddp = DistributedDataParallel::new(model, group.clone(), DdpOptions::default()).unwrap();
    let mut o = optimizer(ddp.module(), Opt::SgdMomentum);
    for step in 0..DDP_STEPS {
        let (x, y) = batch(step, world * DDP_ROWS, &[4]);
        let x = rows(&x, rank, DDP_ROWS).to_device(device).unwrap();
        let y = rows(&y, rank, DDP_ROWS).to_device(device).unwrap();
        let out = ddp.forward(&x).unwrap();
        ddp.backward(&loss(&out, &y)).unwrap();
        o.step().unwrap();
        o.zero_grad(true).unwrap();
    }
    let mine = state(ddp.module());
    // Every rank holds the same parameters, bit for bit (gathered through the group itself).
    let flat: Vec<f32> = mine
        .iter()
        .flat_map(|(_, v)| v.iter().map(|&x| x as f32))
        .collect();
    let n = flat.len();
    let all = Tensor::zeros(&[n * world], DType::F32, device).unwrap();
    let local = Tensor::from_vec(flat.clone(), &[n], Device::Cpu)
        .unwrap()
        .to_device(device)
        .unwrap();
    group.all_gather(&local, &all).unwrap();
    let all = all.to_vec::<f32>().unwrap();
    for r in 0..world {
        let same = all[r * n..(r + 1) * n]
            .iter()
            .zip(&flat)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "rank {r}'s parameters differ from rank {rank}'s");
    }
    println!("rank {rank}: ddp ranks agree");
    if rank == 0 {
        let single = mlp();
        init(&single, 0.0);
        let mut o = optimizer(&single, Opt::SgdMomentum);
        for step in 0..DDP_STEPS {
            let (x, y) = batch(step, world * DDP_ROWS, &[4]);
            loss(&single.forward(&x).unwrap(), &y).backward().unwrap();
            o.step().unwrap();
            o.zero_grad(true).unwrap();
        }
        let want = state(&single);
        let (worst, name) = max_rel_diff(&mine, &want);
        assert!(worst < tolerance, "{name}: {worst}");
        let start = mlp();
        init(&start, 0.0);
        let moved = max_rel_diff(&mine, &state(&start)).0;
        assert!(
            moved > 1e-3,
            "training did not move the parameters ({moved})"
        );
        println!("rank 0: ddp matches one process (max relative difference {worst:.1e} at {name})");
    }
    drop(ddp);
    group.barrier().unwrap();
}
