//! Elementwise functions of one tensor and their derivatives.

use crate::tensor::Tensor;
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{BinaryOp, UnaryOp};
use std::sync::Arc;

/// What a unary op's backward needs kept alive.
#[derive(Clone, Copy)]
enum Save {
    Nothing,
    Input,
    Output,
}

type UnaryGrad = fn(&Tensor, &Tensor) -> Result<Tensor>;

/// ReLU's backward from its output `y`: `g` where `y > 0`, else 0 (PyTorch's
/// `threshold_backward`).
fn relu_grad(y: &Tensor, g: &Tensor) -> Result<Tensor> {
    g.binary_raw(y, BinaryOp::ReluBackward)
}

impl Tensor {
    /// Runs `op` and records `grad(saved, g)` as its backward.
    fn unary_op(
        &self,
        op: UnaryOp,
        name: &'static str,
        save: Save,
        grad: UnaryGrad,
    ) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op(name);
        let storage = self.storage().unary(self.layout(), op)?;
        let out = Tensor::from_storage(storage, self.shape(), None);
        Ok(self.with_unary_node(&out, name, save, grad))
    }

    /// `out` (this tensor's image under a unary op, made without history) re-issued with the
    /// op's node: `grad(saved, g)` as its backward, over the tensor `save` names.
    fn with_unary_node(
        &self,
        out: &Tensor,
        name: &'static str,
        save: Save,
        grad: UnaryGrad,
    ) -> Tensor {
        let node = Tensor::grad_node(name, &[self], |_| {
            let saved = match save {
                Save::Nothing => None,
                Save::Input => Some(self.saved()),
                Save::Output => Some(out.saved()),
            };
            Box::new(move |g| {
                let s = saved.as_ref().unwrap_or(g);
                Ok(vec![Some(grad(s, g)?)])
            })
        });
        Tensor::with_node(out, node)
    }

    /// `out` (made without history) re-issued with `node` as its grad_fn.
    pub(crate) fn with_node(
        out: &Tensor,
        node: Option<Arc<crate::autograd::graph::Node>>,
    ) -> Tensor {
        if node.is_none() {
            return out.clone();
        }
        Tensor::from_parts(out.storage_arc().clone(), out.layout().clone(), node)
    }

    /// `-x`.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Neg, "NegBackward", Save::Nothing, |_, g| g.neg())
    }

    /// `e^x`.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Exp, "ExpBackward", Save::Output, |y, g| {
            g.binary_raw(y, BinaryOp::Mul)
        })
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Log, "LogBackward", Save::Input, |x, g| {
            g.binary_raw(x, BinaryOp::Div)
        })
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sqrt, "SqrtBackward", Save::Output, |y, g| {
            g.div(y)?.mul_scalar(0.5)
        })
    }

    /// `1 / sqrt(x)`.
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Rsqrt, "RsqrtBackward", Save::Output, |y, g| {
            g.mul(&y.mul(y)?.mul(y)?)?.mul_scalar(-0.5)
        })
    }

    /// `|x|` (gradient `sign(x)`, 0 at 0 as in PyTorch).
    pub fn abs(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Abs, "AbsBackward", Save::Input, |x, g| {
            g.mul(&x.sign()?)
        })
    }

    /// `max(x, 0)`.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Relu, "ReluBackward", Save::Output, relu_grad)
    }

    /// [`Tensor::relu`] of a tensor the caller gives up: written over its buffer where nothing
    /// else can see it (no other handle, view or saved copy, and not a leaf that requires grad
    /// while a graph is recorded), as
    /// PyTorch's `inplace=True` does, and a new tensor otherwise. The values and the recorded
    /// backward are `relu`'s either way (its backward reads the output, never the input).
    pub fn into_relu(self) -> Result<Tensor> {
        if !self.reusable_alone() || !self.relu_in_place_supported() {
            return self.relu();
        }
        let _op = crate::autograd::attribution::forward_op("ReluBackward");
        // `max(x, 0)` is relu bit for bit (NaN stays NaN, -0 becomes +0) on every backend.
        self.write_owned(&self.scalar_like(0.0)?, BinaryOp::Maximum)?;
        let out = self.detach();
        Ok(self.with_unary_node(&out, "ReluBackward", Save::Output, relu_grad))
    }

    /// GELU, exact form `x * Φ(x)` (PyTorch's default `approximate='none'`).
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::GeluErf, "GeluBackward", Save::Input, |x, g| {
            g.binary_raw(x, BinaryOp::GeluErfBackward)
        })
    }

    /// GELU, tanh approximation (`approximate='tanh'`).
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::GeluTanh, "GeluBackward", Save::Input, |x, g| {
            g.binary_raw(x, BinaryOp::GeluTanhBackward)
        })
    }

    /// Logistic sigmoid.
    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sigmoid, "SigmoidBackward", Save::Output, |y, g| {
            g.binary_raw(y, BinaryOp::SigmoidBackward)
        })
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Tanh, "TanhBackward", Save::Output, |y, g| {
            g.binary_raw(y, BinaryOp::TanhBackward)
        })
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    pub fn silu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Silu, "SiluBackward", Save::Input, |x, g| {
            g.binary_raw(x, BinaryOp::SiluBackward)
        })
    }

    /// Error function.
    pub fn erf(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Erf, "ErfBackward", Save::Input, |x, g| {
            g.mul(
                &x.mul(x)?
                    .neg()?
                    .exp()?
                    .mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?,
            )
        })
    }

    /// `1 / x`.
    pub fn recip(&self) -> Result<Tensor> {
        self.unary_op(
            UnaryOp::Recip,
            "ReciprocalBackward",
            Save::Output,
            |y, g| g.mul(&y.mul(y)?)?.neg(),
        )
    }

    /// `x * x`.
    pub fn square(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Square, "SquareBackward", Save::Input, |x, g| {
            g.mul(x)?.mul_scalar(2.0)
        })
    }

    /// `sign(x)`: -1, 0 or 1 (gradient zero).
    pub fn sign(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sign, "SignBackward", Save::Nothing, |_, g| {
            g.zeros_like()
        })
    }

    /// An elementwise backward rule (`op` one of the `BinaryOp::*Backward`s, or `Mul` / `Div` for
    /// `exp` / `log`): the gradient `self` and the saved tensor `saved` (same shape) in one pass,
    /// the kernel alone without recording. `saved` is converted to the gradient's dtype first
    /// where they differ.
    fn binary_raw(&self, saved: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let saved = saved.to_dtype(self.dtype())?;
        // The incoming gradient, when backward holds its only handle, takes the result in place.
        if self.updatable_alone_with(&saved) {
            self.binary_in_place(op.name(), &saved, op)?;
            return Ok(self.clone());
        }
        let storage = self
            .storage()
            .binary(self.layout(), &saved.storage(), saved.layout(), op)?;
        Ok(Tensor::from_storage(storage, self.shape(), None))
    }
}
