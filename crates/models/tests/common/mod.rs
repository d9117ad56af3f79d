//! Helpers shared by kiln-models' integration tests: a training step with kiln-optim's
//! SGD-momentum (for the memory-plan tests, which measure what a real step allocates), the
//! check that only a trainable head receives gradients, and an MLP of the activations whose
//! backward writes in place.
#![allow(dead_code)]

use kiln_autograd::Tensor;
use kiln_device::{max_memory_allocated, reset_peak_memory_stats, Device};
use kiln_models::models::{BlockKind, ResNet, ResNetConfig};
use kiln_models::Layer;
use kiln_optim::{Optimizer, ParamGroup, Sgd, SgdOptions};

/// `nn.Sequential(Linear(128, 512), Tanh(), Linear(512, 512), SiLU(), Linear(512, 512),
/// Sigmoid(), Linear(512, 10))`: the summary's torchinfo fixture and the memory plan's test.
pub fn activations_mlp() -> kiln_models::layers::Sequential {
    use kiln_models::layers::{Linear, Sequential, SiLU, Sigmoid, Tanh};
    let linear = |i, o| Linear::new(i, o, true).unwrap();
    Sequential::new()
        .push(linear(128, 512))
        .push(Tanh::new())
        .push(linear(512, 512))
        .push(SiLU::new())
        .push(linear(512, 512))
        .push(Sigmoid::new())
        .push(linear(512, 10))
}

/// torchvision's `ResNet(BasicBlock, [1, 1, 1, 1], num_classes)`, with the small-input (CIFAR)
/// stem when `small_input`: the smallest ResNet the tests train, plan and load.
pub fn tiny_resnet(num_classes: usize, small_input: bool) -> ResNet {
    ResNet::new(ResNetConfig {
        block: BlockKind::Basic,
        layers: [1, 1, 1, 1],
        num_classes,
        small_input,
    })
    .unwrap()
}

/// kiln-optim's SGD with momentum over every parameter of `model` (0.9 momentum, lr 0.01),
/// as a training loop builds it: its momentum buffers appear at its first step.
pub fn sgd_momentum(model: &dyn Layer) -> Sgd {
    Sgd::new(
        vec![ParamGroup::from_module(model)],
        SgdOptions::default().lr(0.01).momentum(0.9),
    )
    .unwrap()
}

/// One SGD-with-momentum step on the loss `mean(model(x)^2)`: backward, then `opt`'s fused
/// step (parameters without a gradient skipped).
pub fn sgd_momentum_step(model: &dyn Layer, opt: &mut Sgd, x: &Tensor) {
    let loss = model
        .forward(x)
        .unwrap()
        .square()
        .unwrap()
        .mean_all()
        .unwrap();
    loss.backward().unwrap();
    drop(loss);
    opt.step().unwrap();
}

/// The CPU allocator's peak above `base` during one steady-state step on `x`: a first step
/// allocates the gradients, they are released, the peak is reset and a second step is
/// measured; gradients are released again afterwards.
pub fn steady_state_peak(model: &dyn Layer, opt: &mut Sgd, x: &Tensor, base: usize) -> usize {
    let cpu = Device::Cpu;
    sgd_momentum_step(model, opt, x); // gradients and momentum exist from here on
    model.zero_grad(true).unwrap();
    reset_peak_memory_stats(cpu).unwrap();
    sgd_momentum_step(model, opt, x);
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
