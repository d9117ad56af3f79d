//! Numerical behaviour of the fused cross-entropy: logits of magnitude 1e4 in f32, the mean's
//! denominators with weights and ignored targets, and no gradient work without a graph.

use kiln_autograd::{no_grad, DType, Device, Tensor};
use kiln_losses::*;

#[test]
fn logits_of_magnitude_1e4_give_exact_losses_and_gradients() {
    // Row 0: the target is the largest logit by 1 → loss = log(1 + e^-1).
    // Row 1: the target is 2e4 below the top → loss = 2e4 exactly in f32.
    let x = Tensor::from_slice(
        &[1e4f32, 1e4 - 1.0, -1e4, -1e4, 1e4, -1e4],
        &[2, 3],
        Device::Cpu,
    )
    .unwrap();
    x.set_requires_grad(true).unwrap();
    let t = Tensor::from_slice(&[0i64, 0], &[2], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let loss = cross_entropy(&x, &t, &opts).unwrap();
    let v = loss.to_vec::<f32>().unwrap();
    assert!(
        (v[0] as f64 - (1.0 + (-1.0f64).exp()).ln()).abs() < 1e-6,
        "{v:?}"
    );
    assert_eq!(v[1], 2e4);
    loss.sum_all().unwrap().backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    let p0 = 1.0 / (1.0 + (-1.0f64).exp());
    assert!((g[0] as f64 - (p0 - 1.0)).abs() < 1e-6, "{g:?}");
    assert!((g[1] as f64 - (1.0 - p0)).abs() < 1e-6, "{g:?}");
    assert_eq!(&g[3..], &[-1.0, 1.0, 0.0]);
    assert!(g.iter().all(|v| v.is_finite()));
}

#[test]
fn mean_divides_by_the_weights_of_the_kept_targets() {
    let x = Tensor::zeros(&[3, 2], DType::F64, Device::Cpu).unwrap();
    let w = Tensor::from_slice(&[1.0f64, 3.0], &[2], Device::Cpu).unwrap();
    let t = Tensor::from_slice(&[0i64, 1, -100], &[3], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        weight: Some(&w),
        ..Default::default()
    };
    // Each kept loss is w[y] ln 2; the mean divides by w[0] + w[1] = 4.
    let mean = cross_entropy(&x, &t, &opts).unwrap().item().unwrap();
    assert!((mean - 2f64.ln()).abs() < 1e-15, "{mean}");
    // All targets ignored: 0 / 0 = NaN, as in PyTorch.
    let all_ignored = Tensor::from_slice(&[-100i64; 3], &[3], Device::Cpu).unwrap();
    assert!(cross_entropy(&x, &all_ignored, &opts)
        .unwrap()
        .item()
        .unwrap()
        .is_nan());
}

#[test]
fn no_graph_without_grad() {
    let x = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let t = Tensor::from_slice(&[0i64, 2], &[2], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let with = cross_entropy(&x, &t, &opts).unwrap();
    assert_eq!(with.grad_fn_name(), Some("CrossEntropyBackward"));
    let without = no_grad(|| cross_entropy(&x, &t, &opts)).unwrap();
    assert!(without.grad_fn_name().is_none());
    assert_eq!(
        without.to_vec::<f32>().unwrap(),
        with.to_vec::<f32>().unwrap()
    );
}
