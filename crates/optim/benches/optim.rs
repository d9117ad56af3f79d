//! Criterion micro-benchmarks of kiln-optim on the CPU (`cargo bench -p kiln-optim`): global-norm
//! clipping (`clip_grad_norm_`, its norm pass plus the scale pass) over 2,000 small gradients and
//! over gradients shaped like torchvision's ResNet-18 parameters, one AdamW step and one SGD
//! step with momentum over the ResNet-18 shapes. Short measurement times (a few seconds per
//! benchmark); throughput is in elements touched. Not run in CI.

// criterion_group! defines a public `fn benches` that cannot carry a doc comment.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln_autograd::{Device, Parameter, Tensor};
use kiln_optim::{clip_grad_norm_, AdamOptions, AdamW, Optimizer, Sgd, SgdOptions};
use std::hint::black_box;
use std::time::Duration;

/// The parameter shapes of torchvision's ResNet-18 (1,000 classes), in registration order.
fn resnet18_shapes() -> Vec<Vec<usize>> {
    let mut shapes = vec![vec![64, 3, 7, 7], vec![64], vec![64]];
    let mut in_ch = 64;
    for stage in 0..4 {
        let planes = 64 << stage;
        for block in 0..2 {
            shapes.extend([vec![planes, in_ch, 3, 3], vec![planes], vec![planes]]);
            shapes.extend([vec![planes, planes, 3, 3], vec![planes], vec![planes]]);
            if stage > 0 && block == 0 {
                shapes.extend([vec![planes, in_ch, 1, 1], vec![planes], vec![planes]]);
            }
            in_ch = planes;
        }
    }
    shapes.extend([vec![1000, 512], vec![1000]]);
    shapes
}

/// Parameters of `shapes` with deterministic values and gradients in [-1, 1].
fn params_with_grads(shapes: &[Vec<usize>]) -> Vec<Parameter> {
    let filled = |shape: &[usize], phase: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + phase).sin()).collect();
        Tensor::from_vec(v, shape, Device::Cpu).expect("a tensor")
    };
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let p = Parameter::new(filled(s, i as f32)).expect("a parameter");
            p.set_grad(Some(filled(s, 0.5 + i as f32)))
                .expect("a gradient");
            p
        })
        .collect()
}

fn elements(params: &[Parameter]) -> u64 {
    params.iter().map(|p| p.numel() as u64).sum()
}

fn clip(c: &mut Criterion) {
    let mut group = c.benchmark_group("clip_grad_norm_");
    let small = params_with_grads(&vec![vec![64]; 2000]);
    group.throughput(Throughput::Elements(elements(&small)));
    group.bench_function("2000_tensors_of_64", |b| {
        b.iter(|| black_box(clip_grad_norm_(&small, 1.0, 2.0, false).expect("clip")))
    });
    let resnet = params_with_grads(&resnet18_shapes());
    group.throughput(Throughput::Elements(elements(&resnet)));
    group.bench_function("resnet18_shapes", |b| {
        b.iter(|| black_box(clip_grad_norm_(&resnet, 1.0, 2.0, false).expect("clip")))
    });
    group.finish();
}

fn steps(c: &mut Criterion) {
    let mut group = c.benchmark_group("optimizer_step_resnet18_shapes");
    let params = params_with_grads(&resnet18_shapes());
    group.throughput(Throughput::Elements(elements(&params)));
    let mut adamw = AdamW::new(params.clone(), AdamOptions::adamw().lr(1e-3)).expect("AdamW");
    group.bench_function("adamw", |b| b.iter(|| adamw.step().expect("step")));
    let options = SgdOptions::default().lr(1e-3).momentum(0.9);
    let mut sgd = Sgd::new(params, options).expect("SGD");
    group.bench_function("sgd_momentum", |b| b.iter(|| sgd.step().expect("step")));
    group.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
}

criterion_group! {
    name = benches;
    config = short();
    targets = clip, steps
}
criterion_main!(benches);
