//! Helpers of the behaviour tests (`semantics.rs`, `clip.rs`).

#![allow(dead_code)]

use kiln_autograd::{Device, Parameter, Tensor};

/// A CPU parameter holding `values`.
pub fn param(values: &[f32]) -> Parameter {
    Parameter::new(Tensor::from_vec(values.to_vec(), &[values.len()], Device::Cpu).unwrap())
        .unwrap()
}

/// Sets `p`'s gradient to `values`.
pub fn grad(p: &Parameter, values: &[f32]) {
    p.set_grad(Some(
        Tensor::from_vec(values.to_vec(), &[values.len()], Device::Cpu).unwrap(),
    ))
    .unwrap();
}

/// `prefix.i` names for `ps`.
pub fn named(ps: &[&Parameter], prefix: &str) -> Vec<(String, Parameter)> {
    ps.iter()
        .enumerate()
        .map(|(i, p)| (format!("{prefix}.{i}"), (*p).clone()))
        .collect()
}
