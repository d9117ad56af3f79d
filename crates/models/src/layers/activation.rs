//! Parameter-free layers: `ReLU`, `GELU`, `Dropout`, `Flatten`, `Identity`.

use crate::error::input_err;
use crate::functional;
use crate::trace::{Act, Tracer};
use crate::{layer_casts, module_tree, Layer, Result};
use kiln_autograd::{Module, Tensor};

macro_rules! stateless_module {
    ($t:ty) => {
        impl Module for $t {
            module_tree!();
        }
    };
}

/// `max(x, 0)` (`torch.nn.ReLU`; kiln has no in-place variant, so its output is a new tensor).
#[derive(Debug)]
pub struct ReLU {
    training: bool,
}

impl ReLU {
    /// A ReLU.
    pub fn new() -> Self {
        ReLU { training: true }
    }
}

impl Default for ReLU {
    fn default() -> Self {
        ReLU::new()
    }
}

stateless_module!(ReLU);

impl Layer for ReLU {
    fn type_name(&self) -> &'static str {
        "ReLU"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.relu()?)
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let out = tracer.output(&[x], x.shape(), x.dtype(), false);
        // The gradient mask is read from the output; the input gradient replaces the output's.
        if x.requires_grad() {
            tracer.save(&out);
        }
        tracer.input_grad_in_place();
        Ok(out)
    }
    layer_casts!();
}

/// The exact (erf) GELU, or its tanh approximation (`torch.nn.GELU(approximate=...)`).
#[derive(Debug)]
pub struct GELU {
    /// True for `approximate = "tanh"`.
    pub tanh: bool,
    training: bool,
}

impl GELU {
    /// The exact GELU (PyTorch's default).
    pub fn new() -> Self {
        GELU {
            tanh: false,
            training: true,
        }
    }

    /// The tanh approximation (GPT-2's).
    pub fn tanh() -> Self {
        GELU {
            tanh: true,
            training: true,
        }
    }
}

impl Default for GELU {
    fn default() -> Self {
        GELU::new()
    }
}

stateless_module!(GELU);

impl Layer for GELU {
    fn type_name(&self) -> &'static str {
        "GELU"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(if self.tanh { x.gelu_tanh()? } else { x.gelu()? })
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        if x.requires_grad() {
            tracer.save(x);
        }
        // The input gradient replaces the output's.
        tracer.input_grad_in_place();
        Ok(tracer.output(&[x], x.shape(), x.dtype(), false))
    }
    layer_casts!();
}

/// Zeroes each element with probability `p` in training and scales the rest by `1 / (1 - p)`
/// (`torch.nn.Dropout`); the identity in eval mode. Masks come from kiln's default generator.
#[derive(Debug)]
pub struct Dropout {
    /// Drop probability.
    pub p: f64,
    training: bool,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1)`.
    pub fn new(p: f64) -> Result<Self> {
        Ok(Dropout {
            p: functional::check_dropout("Dropout", p)?,
            training: true,
        })
    }

    fn active(&self) -> bool {
        self.training && self.p > 0.0
    }
}

stateless_module!(Dropout);

impl Layer for Dropout {
    fn type_name(&self) -> &'static str {
        "Dropout"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        functional::dropout(x, self.p, self.training)
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        if !self.active() {
            return Ok(x.clone());
        }
        // The scaled mask is kept for backward.
        if x.requires_grad() {
            tracer.save_new(x.shape(), x.dtype());
        }
        Ok(tracer.output(&[x], x.shape(), x.dtype(), false))
    }
    layer_casts!();
}

/// Flattens dims `start_dim..=end_dim` into one (`torch.nn.Flatten`, default `1..=-1`).
#[derive(Debug)]
pub struct Flatten {
    /// First dim flattened.
    pub start_dim: isize,
    /// Last dim flattened (negative counts from the end).
    pub end_dim: isize,
    training: bool,
}

impl Flatten {
    /// `Flatten(start_dim = 1, end_dim = -1)`.
    pub fn new() -> Self {
        Flatten {
            start_dim: 1,
            end_dim: -1,
            training: true,
        }
    }
}

impl Default for Flatten {
    fn default() -> Self {
        Flatten::new()
    }
}

stateless_module!(Flatten);

impl Layer for Flatten {
    fn type_name(&self) -> &'static str {
        "Flatten"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.flatten(self.start_dim, self.end_dim)?)
    }
    fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
        let r = x.shape().len() as isize;
        let wrap = |d: isize| if d < 0 { d + r } else { d };
        let (s, e) = (wrap(self.start_dim), wrap(self.end_dim));
        if r == 0 || s < 0 || e >= r || s > e {
            return Err(input_err(
                "Flatten",
                format!(
                    "dims {}..={} do not fit an input of shape {:?}",
                    self.start_dim,
                    self.end_dim,
                    x.shape()
                ),
            ));
        }
        let (s, e) = (s as usize, e as usize);
        let mut shape = x.shape()[..s].to_vec();
        shape.push(x.shape()[s..=e].iter().product());
        shape.extend_from_slice(&x.shape()[e + 1..]);
        Ok(tracer.view(x, &shape))
    }
    layer_casts!();
}

/// Returns its input (`torch.nn.Identity`).
#[derive(Debug)]
pub struct Identity {
    training: bool,
}

impl Identity {
    /// An identity layer.
    pub fn new() -> Self {
        Identity { training: true }
    }
}

impl Default for Identity {
    fn default() -> Self {
        Identity::new()
    }
}

stateless_module!(Identity);

impl Layer for Identity {
    fn type_name(&self) -> &'static str {
        "Identity"
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn trace(&self, _tracer: &mut Tracer, x: &Act) -> Result<Act> {
        Ok(x.clone())
    }
    layer_casts!();
}
