//! PyTorch's default initialisations, drawn from kiln's default (seeded) generator.
//!
//! `Linear` and `Conv2d` use `kaiming_uniform_(a = sqrt(5))` for the weight, which works out to
//! `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`, and the same bound for the bias; torchvision's ResNet
//! then re-draws conv weights with `kaiming_normal_(mode = "fan_out", nonlinearity = "relu")`.
//! `fan_in` is `weight.shape[1] * prod(kernel)`, `fan_out` is `weight.shape[0] * prod(kernel)`.

use crate::Result;
use kiln_autograd::{DType, Device, Parameter, Tensor};

/// `fan_in` and `fan_out` of a weight shape (PyTorch's `_calculate_fan_in_and_fan_out`).
/// Saturating: a shape whose element count overflows `usize` is refused when its tensor is
/// made, so its fans only bound an init that never happens.
pub fn fans(shape: &[usize]) -> (usize, usize) {
    let receptive = shape
        .iter()
        .skip(2)
        .fold(1usize, |n, &d| n.saturating_mul(d));
    let fan_in = shape.get(1).copied().unwrap_or(1).saturating_mul(receptive);
    let fan_out = shape
        .first()
        .copied()
        .unwrap_or(1)
        .saturating_mul(receptive);
    (fan_in, fan_out)
}

/// A parameter drawn from `U(-bound, bound)`.
pub fn uniform(shape: &[usize], bound: f64) -> Result<Parameter> {
    let _parameters = crate::scope::parameters();
    Ok(Parameter::new(Tensor::uniform(
        shape,
        -bound,
        bound,
        DType::F32,
        Device::Cpu,
    )?)?)
}

/// A parameter drawn from `N(mean, std^2)`.
pub fn normal(shape: &[usize], mean: f64, std: f64) -> Result<Parameter> {
    let _parameters = crate::scope::parameters();
    Ok(Parameter::new(Tensor::normal(
        shape,
        mean,
        std,
        DType::F32,
        Device::Cpu,
    )?)?)
}

/// A parameter filled with `value`.
pub fn constant(shape: &[usize], value: f64) -> Result<Parameter> {
    let _parameters = crate::scope::parameters();
    Ok(Parameter::new(Tensor::full(
        shape,
        value,
        DType::F32,
        Device::Cpu,
    )?)?)
}

/// PyTorch's default weight init for `Linear`/`Conv2d`: `kaiming_uniform_(a = sqrt(5))`.
pub fn kaiming_uniform_a_sqrt5(shape: &[usize]) -> Result<Parameter> {
    let (fan_in, _) = fans(shape);
    uniform(shape, 1.0 / (fan_in.max(1) as f64).sqrt())
}

/// `kaiming_normal_(mode = "fan_out", nonlinearity = "relu")`: std `sqrt(2 / fan_out)`.
pub fn kaiming_normal_fan_out(shape: &[usize]) -> Result<Parameter> {
    let (_, fan_out) = fans(shape);
    normal(shape, 0.0, (2.0 / fan_out.max(1) as f64).sqrt())
}

/// `xavier_uniform_`: `U(-b, b)` with `b = sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform(shape: &[usize]) -> Result<Parameter> {
    let (fan_in, fan_out) = fans(shape);
    uniform(shape, (6.0 / (fan_in + fan_out).max(1) as f64).sqrt())
}

/// Re-draws `p` in place from `N(mean, std^2)` (for models that override layer defaults).
pub fn renormal_(p: &Parameter, mean: f64, std: f64) -> Result<()> {
    let _parameters = crate::scope::parameters();
    let fresh = Tensor::normal(p.shape(), mean, std, p.dtype(), p.device())?;
    let _g = kiln_autograd::NoGradGuard::new();
    p.copy_(&fresh)?;
    Ok(())
}

/// Sets `p` to `value` in place.
pub fn fill_(p: &Parameter, value: f64) -> Result<()> {
    let _parameters = crate::scope::parameters();
    let _g = kiln_autograd::NoGradGuard::new();
    p.fill_(value)?;
    Ok(())
}
