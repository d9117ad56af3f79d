//! Elementwise ops: unary functions, broadcasting binary arithmetic, comparisons and `where`.
//! [`ElementwiseOps`] is the family's seam trait. The CPU side is generic strided map loops
//! ([`cpu::map1`], [`cpu::map2`], [`cpu::map3`]); the
//! CUDA side ([`cuda`], `elementwise.cu`) is one grid-stride kernel per op and dtype reading
//! every operand through its strides, with flat and 16-byte vector paths for unary and binary
//! ops on unit-stride operands.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod float;

use crate::ops::buffer::BufferOps;
use crate::seam::{pass_through, seam_trait};
use crate::{Layout, Result};

/// Elementwise functions of one tensor. The `*Grad` variants are derivatives used by backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `e^x`
    Exp,
    /// natural log
    Log,
    /// square root
    Sqrt,
    /// `1/sqrt(x)`
    Rsqrt,
    /// `|x|`
    Abs,
    /// `max(x, 0)`
    Relu,
    /// GELU, exact form `x * Φ(x)` with `erf`
    GeluErf,
    /// GELU, tanh approximation
    GeluTanh,
    /// logistic sigmoid
    Sigmoid,
    /// hyperbolic tangent
    Tanh,
    /// `x * sigmoid(x)`
    Silu,
    /// `sign(x)` (-1, 0 or 1)
    Sign,
    /// `erf(x)`
    Erf,
    /// `1/x`
    Recip,
    /// `x * x`
    Square,
    /// 1 where `x > 0`, else 0 (derivative of relu)
    ReluGrad,
    /// derivative of exact GELU
    GeluErfGrad,
    /// derivative of tanh-approximate GELU
    GeluTanhGrad,
    /// derivative of SiLU
    SiluGrad,
}

impl UnaryOp {
    /// The op's PyTorch-style name, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Abs => "abs",
            UnaryOp::Relu => "relu",
            UnaryOp::GeluErf | UnaryOp::GeluTanh => "gelu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Sign => "sign",
            UnaryOp::Erf => "erf",
            UnaryOp::Recip => "reciprocal",
            UnaryOp::Square => "square",
            UnaryOp::ReluGrad => "relu_backward",
            UnaryOp::GeluErfGrad | UnaryOp::GeluTanhGrad => "gelu_backward",
            UnaryOp::SiluGrad => "silu_backward",
        }
    }
}

/// Elementwise functions of two same-shaped (possibly broadcast) tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (true division for floats, truncating for integers)
    Div,
    /// `a ^ b` (floats only)
    Pow,
    /// `max(a, b)`, NaN-propagating
    Maximum,
    /// `min(a, b)`, NaN-propagating
    Minimum,
}

impl BinaryOp {
    /// The op's PyTorch-style name, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
        }
    }
}

/// Elementwise comparisons; the result has dtype `Bool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// `a == b`
    Eq,
    /// `a != b`
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
}

pass_through!(UnaryOp, BinaryOp, CmpOp);

seam_trait! {
    /// Elementwise ops of one, two or three same-shaped inputs (broadcast already).
    pub trait ElementwiseOps: BufferOps {
        /// Elementwise `op`.
        fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self>;
        /// Elementwise `op` of two inputs whose layouts have the same shape (broadcast already).
        op(op.name())
        fn binary(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: BinaryOp)
            -> Result<Self>;
        /// Elementwise comparison; result dtype `Bool`.
        op("comparison")
        fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp)
            -> Result<Self>;
        /// `self` is a `Bool`/`U8` condition: picks `on_true` where nonzero, else `on_false`.
        op("where")
        fn where_cond(
            &self,
            layout: &Layout,
            on_true: &Self,
            true_layout: &Layout,
            on_false: &Self,
            false_layout: &Layout,
        ) -> Result<Self>;
    }
}
