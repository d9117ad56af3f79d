//! f64 finite-difference gradient checks of every loss (inputs and, where defined, targets).

mod common;

use common::gradcheck;
use kiln_autograd::{DType, Device, Generator, Tensor};
use kiln_losses::*;

fn normal(seed: u64, shape: &[usize]) -> Tensor {
    Generator::new(seed)
        .normal(shape, 0.0, 1.0, DType::F64, Device::Cpu)
        .unwrap()
}

fn uniform(seed: u64, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    Generator::new(seed)
        .uniform(shape, lo, hi, DType::F64, Device::Cpu)
        .unwrap()
}

fn ints(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

#[test]
fn cross_entropy_gradients() {
    let w = uniform(3, &[4], 0.5, 1.5);
    let t = ints(&[0, 3, -100, 2, 1], &[5]);
    for reduction in [Reduction::None, Reduction::Mean, Reduction::Sum] {
        for ls in [0.0, 0.25] {
            gradcheck("cross_entropy index", &[normal(1, &[5, 4])], |x| {
                let opts = CrossEntropyOptions {
                    weight: Some(&w),
                    reduction,
                    label_smoothing: ls,
                    ..Default::default()
                };
                cross_entropy(&x[0], &t, &opts)
            });
        }
    }
    let ts = ints(&[0, 2, 1, 1, 0, 2, 2, 1], &[2, 2, 2]);
    gradcheck("cross_entropy spatial", &[normal(2, &[2, 3, 2, 2])], |x| {
        cross_entropy(
            &x[0],
            &ts,
            &CrossEntropyOptions {
                ignore_index: 1,
                ..Default::default()
            },
        )
    });
    let p = normal(4, &[3, 4]).softmax(1).unwrap();
    gradcheck(
        "cross_entropy probabilities",
        &[normal(5, &[3, 4]), p],
        |v| {
            let opts = CrossEntropyOptions {
                weight: Some(&w),
                label_smoothing: 0.1,
                ..Default::default()
            };
            cross_entropy(&v[0], &v[1], &opts)
        },
    );
    // A non-contiguous (transposed) logits view goes through the same kernel.
    gradcheck(
        "cross_entropy transposed view",
        &[normal(6, &[4, 5])],
        |x| {
            cross_entropy(
                &x[0].t()?,
                &t,
                &CrossEntropyOptions {
                    reduction: Reduction::Sum,
                    ..Default::default()
                },
            )
        },
    );
}

#[test]
fn nll_loss_gradients() {
    let w = uniform(3, &[4], 0.5, 1.5);
    let t = ints(&[0, 3, -100, 2, 1], &[5]);
    gradcheck("nll_loss", &[normal(1, &[5, 4])], |x| {
        nll_loss(
            &x[0],
            &t,
            &NllLossOptions {
                weight: Some(&w),
                ..Default::default()
            },
        )
    });
}

#[test]
fn regression_gradients() {
    // Differences well away from 0 and from the beta / delta kinks.
    let x = normal(7, &[3, 4]);
    let offsets = Tensor::from_vec(
        vec![
            0.3, -0.2, 2.5, -3.0, 0.1, 1.7, -1.9, 0.45, -0.6, 2.2, -0.35, 4.0,
        ],
        &[3, 4],
        Device::Cpu,
    )
    .unwrap();
    let y = x.sub(&offsets).unwrap();
    let both = [x, y];
    for reduction in [Reduction::None, Reduction::Mean, Reduction::Sum] {
        gradcheck("mse_loss", &both, |v| mse_loss(&v[0], &v[1], reduction));
        gradcheck("l1_loss", &both, |v| l1_loss(&v[0], &v[1], reduction));
        gradcheck("smooth_l1_loss", &both, |v| {
            smooth_l1_loss(&v[0], &v[1], reduction, 0.8)
        });
        gradcheck("huber_loss", &both, |v| {
            huber_loss(&v[0], &v[1], reduction, 1.2)
        });
    }
}

#[test]
fn binary_cross_entropy_gradients() {
    let x = uniform(8, &[3, 4], 0.05, 0.95);
    let y = uniform(9, &[3, 4], 0.0, 1.0);
    let w = uniform(10, &[4], 0.5, 1.5);
    gradcheck("binary_cross_entropy", &[x, y.clone()], |v| {
        binary_cross_entropy(
            &v[0],
            &v[1],
            &BceOptions {
                weight: Some(&w),
                reduction: Reduction::Sum,
            },
        )
    });
    let logits = normal(11, &[3, 4]).mul_scalar(3.0).unwrap();
    let pw = uniform(12, &[4], 0.2, 3.0);
    gradcheck("binary_cross_entropy_with_logits", &[logits, y], |v| {
        let opts = BceWithLogitsOptions {
            weight: Some(&w),
            pos_weight: Some(&pw),
            reduction: Reduction::Mean,
        };
        binary_cross_entropy_with_logits(&v[0], &v[1], &opts)
    });
}

#[test]
fn kl_div_gradients() {
    let x = normal(13, &[3, 5]).log_softmax(1).unwrap();
    let t = normal(14, &[3, 5]).softmax(1).unwrap();
    gradcheck("kl_div", &[x.clone(), t.clone()], |v| {
        kl_div(&v[0], &v[1], KlDivReduction::BatchMean, false)
    });
    gradcheck("kl_div log_target", &[x, t.log().unwrap()], |v| {
        kl_div(&v[0], &v[1], KlDivReduction::Sum, true)
    });
}
