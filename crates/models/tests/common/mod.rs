//! Helpers shared by kiln-models' integration tests: a training step with SGD-momentum done by
//! hand (for the memory-plan tests, which measure what a real step allocates) and the check
//! that only a trainable head receives gradients.
#![allow(dead_code)]

use kiln_autograd::Tensor;
use kiln_device::{max_memory_allocated, reset_peak_memory_stats, Device};
use kiln_models::Layer;

/// Zeroed momentum buffers, one per parameter of `model`.
pub fn momentum_buffers(model: &dyn Layer) -> Vec<Tensor> {
    model
        .parameters()
        .iter()
        .map(|p| p.zeros_like().unwrap())
        .collect()
}

/// One SGD-with-momentum step on the loss `mean(model(x)^2)` (momentum buffers allocated by
/// the caller), as an optimizer does: 0.9 momentum, lr 0.01, parameters without a gradient
/// skipped.
pub fn sgd_momentum_step(model: &dyn Layer, momentum: &[Tensor], x: &Tensor) {
    let loss = model
        .forward(x)
        .unwrap()
        .square()
        .unwrap()
        .mean_all()
        .unwrap();
    loss.backward().unwrap();
    let _g = kiln_autograd::NoGradGuard::new();
    for (p, m) in model.parameters().iter().zip(momentum) {
        let Some(g) = p.grad() else { continue };
        m.mul_scalar_(0.9).unwrap();
        m.add_(&g).unwrap();
        p.add_scaled_(m, -0.01).unwrap();
    }
}

/// The CPU allocator's peak above `base` during one steady-state step on `x`: a first step
/// allocates the gradients, they are released, the peak is reset and a second step is
/// measured; gradients are released again afterwards.
pub fn steady_state_peak(model: &dyn Layer, momentum: &[Tensor], x: &Tensor, base: usize) -> usize {
    let cpu = Device::Cpu;
    sgd_momentum_step(model, momentum, x); // gradients exist from here on, as in steady state
    model.zero_grad(true).unwrap();
    reset_peak_memory_stats(cpu).unwrap();
    sgd_momentum_step(model, momentum, x);
    model.zero_grad(true).unwrap();
    max_memory_allocated(cpu).unwrap() - base
}

/// Asserts the plan's `predicted` peak at `batch` is within 10% of the `measured` one.
pub fn assert_within_ten_percent(batch: usize, predicted: usize, measured: usize) {
    let ratio = predicted as f64 / measured as f64;
    println!("batch {batch}: predicted {predicted} B, max_memory_allocated {measured} B, ratio {ratio:.3}");
    assert!(
        (0.9..=1.1).contains(&ratio),
        "batch {batch}: ratio {ratio:.3}"
    );
}

/// Back-propagates `sum(model(x))` and asserts exactly the parameters named with
/// `head_prefix` got a gradient.
pub fn assert_only_head_gets_gradients(model: &dyn Layer, x: &Tensor, head_prefix: &str) {
    model
        .forward(x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (name, p) in model.named_parameters() {
        assert_eq!(p.grad().is_some(), name.starts_with(head_prefix), "{name}");
    }
}
