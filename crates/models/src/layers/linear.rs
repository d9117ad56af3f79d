//! `Linear`: `y = x W^T + b` over the last dim.

use crate::error::input_err;
use crate::init;
use crate::layer::any_trainable;
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{Module, Parameter, Tensor};

/// A fully connected layer (`torch.nn.Linear`): `weight` `[out, in]`, optional `bias` `[out]`.
#[derive(Debug)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Parameter,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Parameter>,
    training: bool,
}

impl Linear {
    /// A layer with PyTorch's default init (kaiming-uniform, a = sqrt(5); bias `U(±1/sqrt(in))`).
    pub fn new(in_features: usize, out_features: usize, bias: bool) -> Result<Self> {
        let weight = init::kaiming_uniform_a_sqrt5(&[out_features, in_features])?;
        let bias = if bias {
            Some(init::uniform(
                &[out_features],
                1.0 / (in_features.max(1) as f64).sqrt(),
            )?)
        } else {
            None
        };
        Ok(Linear {
            weight,
            bias,
            training: true,
        })
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    fn check(&self, shape: &[usize]) -> Result<Vec<usize>> {
        match shape.last() {
            Some(&d) if d == self.in_features() => {
                let mut out = shape.to_vec();
                *out.last_mut().expect("non-empty") = self.out_features();
                Ok(out)
            }
            _ => Err(input_err(
                "Linear",
                format!(
                    "expected an input whose last dim is in_features = {}, got shape {:?}; \
                     flatten or reshape the input, or build Linear::new({}, ..)",
                    self.in_features(),
                    shape,
                    shape.last().copied().unwrap_or(0)
                ),
            )),
        }
    }
}

impl Module for Linear {
    fn own_parameters(&self) -> Vec<(String, Parameter)> {
        let mut out = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            out.push(("bias".to_string(), b.clone()));
        }
        out
    }
    module_tree!();
}

impl Layer for Linear {
    fn type_name(&self) -> &'static str {
        "Linear"
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.check(x.shape())?;
        let y = x.matmul(&self.weight.t()?)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let shape = self.check(x.shape())?;
        let trainable = any_trainable(std::iter::once(&self.weight).chain(&self.bias));
        let out = tracer.output(&[x], &shape, x.dtype(), trainable);
        if out.requires_grad() && self.weight.requires_grad() {
            // Only the weight's gradient reads the input, so a frozen weight's matmul keeps
            // none (PyTorch's rule, and kiln's).
            tracer.save(x);
        }
        if self.bias.is_some() {
            // `x @ weight.t()` lives next to the output while the bias is added to it.
            tracer.forward_temporary(out.bytes());
        }
        Ok(out)
    }

    layer_casts!();
}
