//! What a gradient test needs from the autograd side, for any crate's tests: the analytic
//! gradients that `backward` gives and a way to re-evaluate the same scalar at perturbed
//! inputs. The comparison against finite differences is the test's (kiln-testkit's
//! `gradcheck`); nothing here asserts.
//!
//! Invariants: the scalar is `sum(f(inputs) * w)` with `w` drawn once, uniform in
//! `[0.5, 1.5)` from `Generator::new(99)`, so every output element carries a different weight
//! and a gradient that mixes elements up is caught; inputs must be `F64` (the values are read
//! and perturbed as `f64`); re-evaluation runs under `no_grad` with the unperturbed inputs as
//! they were given (same layout), only the perturbed one rebuilt contiguous on the CPU.

use crate::error::arg_err;
use crate::{no_grad, DType, Device, Error, Generator, Tensor};

/// The analytic side of a gradient check of `f` at `inputs` (see the module docs).
pub struct GradProbe<F> {
    f: F,
    leaves: Vec<Tensor>,
    weights: Tensor,
    /// Each input's values, row-major.
    pub values: Vec<Vec<f64>>,
    /// The gradient of the weighted sum with respect to each input, row-major.
    pub analytic: Vec<Vec<f64>>,
}

/// Runs `f` on leaf copies of `inputs` and back-propagates the weighted sum of its output.
/// Fails with `f`'s error, or when an input is not `F64` or gets no gradient.
pub fn grad_probe<F, E>(inputs: &[Tensor], f: F) -> Result<GradProbe<F>, E>
where
    F: Fn(&[Tensor]) -> Result<Tensor, E>,
    E: From<Error>,
{
    let mut leaves = Vec::with_capacity(inputs.len());
    for (i, t) in inputs.iter().enumerate() {
        if t.dtype() != DType::F64 {
            return Err(arg_err(
                "grad_probe",
                format!(
                    "input {i} is {}; gradient checks need F64 inputs",
                    t.dtype()
                ),
            )
            .into());
        }
        let leaf = t.detach();
        leaf.set_requires_grad(true)?;
        leaves.push(leaf);
    }
    let out = f(&leaves)?;
    let weights = Generator::new(99).uniform(out.shape(), 0.5, 1.5, DType::F64, Device::Cpu)?;
    out.mul(&weights)?.sum_all()?.backward()?;
    let mut analytic = Vec::with_capacity(leaves.len());
    let mut values = Vec::with_capacity(leaves.len());
    for (i, leaf) in leaves.iter().enumerate() {
        let grad = leaf.grad().ok_or_else(|| {
            arg_err(
                "grad_probe",
                format!("input {i} got no gradient; is it used by the function?"),
            )
        })?;
        analytic.push(grad.to_vec::<f64>()?);
        values.push(leaf.to_vec::<f64>()?);
    }
    Ok(GradProbe {
        f,
        leaves,
        weights,
        values,
        analytic,
    })
}

impl<F, E> GradProbe<F>
where
    F: Fn(&[Tensor]) -> Result<Tensor, E>,
    E: From<Error>,
{
    /// The weighted sum with input `input` replaced by `values` (its shape kept), under
    /// `no_grad`.
    pub fn loss(&self, input: usize, values: &[f64]) -> Result<f64, E> {
        let leaf = self.leaves.get(input).ok_or_else(|| {
            arg_err(
                "grad_probe",
                format!("input {input} of {}", self.leaves.len()),
            )
        })?;
        let mut args: Vec<Tensor> = self.leaves.iter().map(Tensor::detach).collect();
        args[input] = Tensor::from_vec(values.to_vec(), leaf.shape(), Device::Cpu)?;
        no_grad(|| Ok((self.f)(&args)?.mul(&self.weights)?.sum_all()?.item()?))
    }
}
