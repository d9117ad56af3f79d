//! Elementwise ops: unary functions, broadcasting binary arithmetic, comparisons and `where`.
//! [`ElementwiseOps`] is the family's seam trait. The CPU side is generic strided map loops
//! ([`cpu::map1`], [`cpu::map2`], [`cpu::map3`]); the
//! CUDA side ([`cuda`], `elementwise.cu`) is one grid-stride kernel per op and dtype reading
//! every operand through its strides, with flat and 16-byte vector paths for unary and binary
//! ops on unit-stride operands.

pub mod cpu;
mod cpu_assign;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::ops::buffer::BufferOps;
use crate::seam::{pass_through, seam_trait};
use crate::{Layout, Result};

/// Declares the op-code enums and the text of `kiln_op_codes.cuh` from one list, so the Rust
/// enums, the codes the CUDA launchers pass and the `#define`s `elementwise.cu` switches on can
/// never drift apart. Each entry is `Variant = code, C_NAME, "name"`: the `.cu` sees
/// `#define <PREFIX>C_NAME code`, `code()` returns `code` and `name()` returns `"name"`.
macro_rules! op_tables {
    ($(
        $(#[$attr:meta])*
        pub enum $enum:ident as $prefix:literal {
            $($(#[$vattr:meta])* $variant:ident = $code:literal, $c_name:ident, $name:literal;)*
        }
    )*) => {
        $(
            $(#[$attr])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
            pub enum $enum {
                $($(#[$vattr])* $variant,)*
            }

            impl $enum {
                /// The op's PyTorch-style name, for error messages.
                pub fn name(self) -> &'static str {
                    match self {
                        $($enum::$variant => $name,)*
                    }
                }

                /// The op's code in `kiln_op_codes.cuh` (what the CUDA kernels switch on).
                pub fn code(self) -> u32 {
                    match self {
                        $($enum::$variant => $code,)*
                    }
                }
            }
        )*

        /// The text of `kiln_op_codes.cuh`: one `#define` per op code, generated from the enums'
        /// list (spliced into `elementwise.cu` by the kernel loader and `cargo xtask kernels`).
        pub const OP_CODES_CUH: &str = concat!(
            "// Generated from the op tables in crates/device/src/ops/elementwise/mod.rs.\n",
            "#pragma once\n",
            $($("#define ", $prefix, stringify!($c_name), " ", stringify!($code), "\n",)*)*
        );
    };
}

op_tables! {
    /// Elementwise functions of one tensor. The `*Grad` variants are derivatives used by
    /// backward.
    pub enum UnaryOp as "UNARY_" {
        /// `-x`
        Neg = 0, NEG, "neg";
        /// `e^x`
        Exp = 1, EXP, "exp";
        /// natural log
        Log = 2, LOG, "log";
        /// square root
        Sqrt = 3, SQRT, "sqrt";
        /// `1/sqrt(x)`
        Rsqrt = 4, RSQRT, "rsqrt";
        /// `|x|`
        Abs = 5, ABS, "abs";
        /// `max(x, 0)`
        Relu = 6, RELU, "relu";
        /// GELU, exact form `x * Φ(x)` with `erf`
        GeluErf = 7, GELU_ERF, "gelu";
        /// GELU, tanh approximation
        GeluTanh = 8, GELU_TANH, "gelu";
        /// logistic sigmoid
        Sigmoid = 9, SIGMOID, "sigmoid";
        /// hyperbolic tangent
        Tanh = 10, TANH, "tanh";
        /// `x * sigmoid(x)`
        Silu = 11, SILU, "silu";
        /// `sign(x)` (-1, 0 or 1)
        Sign = 12, SIGN, "sign";
        /// `erf(x)`
        Erf = 13, ERF, "erf";
        /// `1/x`
        Recip = 14, RECIP, "reciprocal";
        /// `x * x`
        Square = 15, SQUARE, "square";
    }

    /// Elementwise functions of two same-shaped (possibly broadcast) tensors. The `*Backward`
    /// variants are activation backwards fused into one pass: `a` is the output gradient, `b`
    /// the activation's saved input (its output for relu), the result the input gradient.
    pub enum BinaryOp as "BINARY_" {
        /// `a + b`
        Add = 0, ADD, "add";
        /// `a - b`
        Sub = 1, SUB, "sub";
        /// `a * b`
        Mul = 2, MUL, "mul";
        /// `a / b` (true division for floats, truncating for integers)
        Div = 3, DIV, "div";
        /// `a ^ b` (floats only)
        Pow = 4, POW, "pow";
        /// `max(a, b)`, NaN-propagating
        Maximum = 5, MAXIMUM, "maximum";
        /// `min(a, b)`, NaN-propagating
        Minimum = 6, MINIMUM, "minimum";
        /// relu's backward from its output `b`: 0 where `b <= 0`, else `a` (PyTorch's
        /// `threshold_backward`: a NaN or infinite gradient at an inactive unit gives 0)
        ReluBackward = 7, RELU_BACKWARD, "relu_backward";
        /// `a * gelu'(b)`, exact GELU
        GeluErfBackward = 8, GELU_ERF_BACKWARD, "gelu_backward";
        /// `a * gelu'(b)`, tanh-approximate GELU
        GeluTanhBackward = 9, GELU_TANH_BACKWARD, "gelu_backward";
        /// `a * silu'(b)`
        SiluBackward = 10, SILU_BACKWARD, "silu_backward";
        /// sigmoid's backward from its output `b`: `a * (1 - b) * b`, in PyTorch's order
        SigmoidBackward = 11, SIGMOID_BACKWARD, "sigmoid_backward";
        /// tanh's backward from its output `b`: `a * (1 - b * b)`
        TanhBackward = 12, TANH_BACKWARD, "tanh_backward";
    }

    /// Elementwise comparisons; the result has dtype `Bool`.
    pub enum CmpOp as "CMP_" {
        /// `a == b`
        Eq = 0, EQ, "eq";
        /// `a != b`
        Ne = 1, NE, "ne";
        /// `a < b`
        Lt = 2, LT, "lt";
        /// `a <= b`
        Le = 3, LE, "le";
        /// `a > b`
        Gt = 4, GT, "gt";
        /// `a >= b`
        Ge = 5, GE, "ge";
    }
}

impl BinaryOp {
    /// Whether the op is defined on integers (`Pow` and the activation backwards are not).
    pub fn takes_integers(self) -> bool {
        !matches!(
            self,
            BinaryOp::Pow
                | BinaryOp::ReluBackward
                | BinaryOp::GeluErfBackward
                | BinaryOp::GeluTanhBackward
                | BinaryOp::SiluBackward
                | BinaryOp::SigmoidBackward
                | BinaryOp::TanhBackward
        )
    }
}

pass_through!(UnaryOp, BinaryOp, CmpOp);

/// The `alpha` that [`ElementwiseOps::add_scaled_into`] multiplies by for a `dtype` it computes
/// in f32: rounded to the dtype for f16/bf16 (PyTorch's CPU kernel on a contiguous destination),
/// to f32 for f32. Both backends take it from here.
pub(crate) fn add_scaled_alpha_f32(dtype: crate::DType, alpha: f64) -> f32 {
    use crate::DType;
    match dtype {
        DType::F16 => half::f16::from_f64(alpha).to_f32(),
        DType::BF16 => half::bf16::from_f64(alpha).to_f32(),
        _ => alpha as f32,
    }
}

seam_trait! {
    /// Elementwise ops of one, two or three same-shaped inputs (broadcast already).
    pub trait ElementwiseOps: BufferOps {
        /// Elementwise `op`.
        fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self>;
        /// Elementwise `op` of two inputs whose layouts have the same shape (broadcast already).
        op(op.name())
        fn binary(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: BinaryOp)
            -> Result<Self>;
        /// In place: every element of `dst` through `dst_layout` becomes `op(dst, self)`, with
        /// `self` the right operand read through `layout` (of `dst_layout`'s shape, broadcast
        /// already). `dst` is another buffer of the same dtype, and `dst_layout` maps no two
        /// elements to one place (the caller refuses expanded views). Nothing is allocated
        /// unless noted by the backend.
        op(op.name())
        fn binary_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout, op: BinaryOp)
            -> Result<()>;
        /// In place: every element of `dst` through `dst_layout` becomes `dst + alpha * self`,
        /// rounded once (a fused multiply-add, PyTorch's `add_(other, alpha=alpha)`), with
        /// `self` read through `layout`; the same operand rules as [`Self::binary_into`].
        /// Floats only. f16/bf16 round `alpha` to their dtype, fuse in f32 and round once: what
        /// PyTorch's CPU kernel does on a contiguous destination, here on every layout and
        /// device (PyTorch's CPU kernel rounds each step in 16 bits on strided views, its CUDA
        /// kernel keeps `alpha` in f32).
        op("add_")
        fn add_scaled_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout, alpha: f64)
            -> Result<()>;
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
