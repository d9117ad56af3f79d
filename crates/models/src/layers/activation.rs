//! Parameter-free layers: the activations (`ReLU`, `Sigmoid`, `Tanh`, `SiLU`, `GELU`),
//! `Dropout`, `Flatten`, `Identity`.

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

/// Which tensor an elementwise activation's backward reads.
#[derive(Clone, Copy)]
enum Saves {
    Input,
    Output,
}

/// The trace of an elementwise activation: an output of the input's shape, the tensor its
/// backward reads saved, and its input gradient written over the output's (kiln-autograd's
/// elementwise rules take a gradient no one else holds), so one gradient is in flight.
fn trace_elementwise(tracer: &mut Tracer, x: &Act, saves: Saves) -> Act {
    let out = tracer.output(&[x], x.shape(), x.dtype(), false);
    if x.requires_grad() {
        tracer.save(match saves {
            Saves::Input => x,
            Saves::Output => &out,
        });
    }
    tracer.input_grad_in_place();
    out
}

/// A parameter-free elementwise activation layer calling `Tensor::$forward`, whose backward
/// reads the tensor `$saves` names; with `owned = $owned`, `Tensor::$owned` serves an input
/// the caller gives up ([`Layer::forward_owned`]).
macro_rules! activation_layer {
    ($(#[$doc:meta])* $name:ident, $forward:ident, $saves:expr $(, owned = $owned:ident)?) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            training: bool,
        }

        impl $name {
            /// The layer (it has no parameters or settings).
            pub fn new() -> Self {
                $name { training: true }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }

        stateless_module!($name);

        impl Layer for $name {
            fn type_name(&self) -> &'static str {
                stringify!($name)
            }
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                Ok(x.$forward()?)
            }
            $(
                fn forward_owned(&self, x: Tensor) -> Result<Tensor> {
                    Ok(x.$owned()?)
                }
            )?
            fn trace(&self, tracer: &mut Tracer, x: &Act) -> Result<Act> {
                Ok(trace_elementwise(tracer, x, $saves))
            }
            layer_casts!();
        }
    };
}

activation_layer!(
    /// `max(x, 0)` (`torch.nn.ReLU`). Its backward reads the output's sign. Given its input
    /// ([`Layer::forward_owned`]: the residual blocks and [`crate::layers::Sequential`] do) it writes
    /// over it where nothing else can see it ([`Tensor::into_relu`]), as `inplace=True` does
    /// in PyTorch; a new tensor otherwise.
    ReLU,
    relu,
    Saves::Output,
    owned = into_relu
);

activation_layer!(
    /// `1 / (1 + e^-x)` (`torch.nn.Sigmoid`); its backward reads the output.
    Sigmoid,
    sigmoid,
    Saves::Output
);

activation_layer!(
    /// `tanh(x)` (`torch.nn.Tanh`); its backward reads the output.
    Tanh,
    tanh,
    Saves::Output
);

activation_layer!(
    /// `x * sigmoid(x)` (`torch.nn.SiLU`, also called swish); its backward reads the input.
    SiLU,
    silu,
    Saves::Input
);

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
        Ok(trace_elementwise(tracer, x, Saves::Input))
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
