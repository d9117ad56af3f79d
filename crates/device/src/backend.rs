//! The backend seam: the one trait through which every tensor op reaches its kernel.
//!
//! `kiln-autograd` never touches a buffer directly. It validates shapes, builds [`Layout`]s (views,
//! broadcasts) and then calls a method of [`BackendStorage`] on a [`crate::Storage`], which
//! dispatches on the device to [`crate::CpuStorage`] or, behind the `cuda` feature, to
//! [`crate::CudaStorage`]. Adding a device means implementing this trait; no op is written for one
//! device only. Kernels take any strided input layout and return a fresh contiguous buffer, except
//! [`BackendStorage::copy_into`], which writes through a strided destination layout (used by
//! `cat`, `stack` and the backward of `narrow`/`select`), and
//! [`BackendStorage::batch_norm_train`], which also updates the running statistics in place.
//!
//! The neural-network methods (convolution, pooling, normalisation, indexing) take extra
//! operands as [`Strided`] pairs and their validated geometry types from [`crate::ops`]; each
//! forward returns what its backward needs (max-pooling indices, batch/layer-norm statistics),
//! and each backward takes a [`GradMask`] so only the gradients that are needed are computed. A
//! device without a kernel for one of them returns [`crate::Error::NotImplemented`] naming the
//! op; no method falls back to another device silently.

use crate::ops::conv::Conv2dGeometry;
use crate::ops::pool::{AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, MaxPool2dGeometry};
use crate::{DType, Device, Layout, Result};

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

/// Reductions over a set of dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// sum (floats accumulate in f64, integers in i64; bool sums to i64)
    Sum,
    /// maximum (NaN-propagating)
    Max,
    /// minimum (NaN-propagating)
    Min,
    /// index of the first maximum along exactly one dim, as `I64`
    ArgMax,
    /// index of the first minimum along exactly one dim, as `I64`
    ArgMin,
}

/// An operand read through a layout: a buffer and the view of it the op uses.
pub type Strided<'a, S> = (&'a S, &'a Layout);

/// A 2-D pooling op and its validated geometry (input `[N, C, H, W]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool2d {
    /// `max_pool2d`; its forward also returns the `I64` argmax indices backward needs.
    Max(MaxPool2dGeometry),
    /// `avg_pool2d`.
    Avg(AvgPool2dGeometry),
    /// `adaptive_avg_pool2d`.
    AdaptiveAvg(AdaptiveAvgPool2dGeometry),
}

/// Batch norm's running statistics, updated in place by a training forward:
/// `running = (1 - momentum) * running + momentum * batch_stat` (unbiased variance).
#[derive(Debug)]
pub struct RunningStatsMut<'a, S> {
    /// Running mean `[C]` (a contiguous view).
    pub mean: (&'a mut S, &'a Layout),
    /// Running variance `[C]` (a contiguous view).
    pub var: (&'a mut S, &'a Layout),
    /// Weight of the new batch statistic.
    pub momentum: f64,
}

/// The per-channel statistics a batch-norm backward differentiates through.
#[derive(Debug, Clone, Copy)]
pub enum BatchNormStats<'a, S> {
    /// Training: the batch `mean` and `rstd = 1 / sqrt(var + eps)` the forward returned.
    Batch {
        /// Saved mean `[C]`.
        mean: Strided<'a, S>,
        /// Saved `rstd` `[C]`.
        rstd: Strided<'a, S>,
    },
    /// Evaluation: the running statistics (constants) and `eps`.
    Running {
        /// Running mean `[C]`.
        mean: Strided<'a, S>,
        /// Running variance `[C]`.
        var: Strided<'a, S>,
        /// The forward's `eps`.
        eps: f64,
    },
}

/// Which gradients a backward computes (PyTorch's `output_mask`): input, weight, bias.
pub type GradMask = [bool; 3];

/// Gradients of an op with input, weight and bias; `None` where not asked for.
pub type Grads3<S> = [Option<S>; 3];

/// The kernels of one device over its buffer type.
///
/// Every method reads `self` through a [`Layout`] (any strides, offset) and returns a new
/// contiguous buffer, except `copy_into`. Shapes have been validated by the caller.
pub trait BackendStorage: Sized + Send + Sync {
    /// The element type.
    fn dtype(&self) -> DType;
    /// The device holding the buffer.
    fn device(&self) -> Device;
    /// Number of elements in the buffer.
    fn len(&self) -> usize;
    /// True when the buffer has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` elements equal to `value` (converted to `dtype`).
    fn full(device: Device, n: usize, value: f64, dtype: DType) -> Result<Self>;
    /// `start, start + step, ...` (`n` elements).
    fn arange(device: Device, start: f64, step: f64, n: usize, dtype: DType) -> Result<Self>;
    /// `n` uniform samples in `[low, high)` from Philox4x32-10 with `seed`, counters from `offset`.
    fn rand_uniform(
        device: Device,
        n: usize,
        low: f64,
        high: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self>;
    /// `n` normal samples (Box-Muller over Philox4x32-10), counters from `offset`.
    fn rand_normal(
        device: Device,
        n: usize,
        mean: f64,
        std: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self>;
    /// A copy of a host buffer on `device`.
    fn from_cpu(device: Device, cpu: &crate::CpuStorage) -> Result<Self>;
    /// The elements of `layout`, contiguous, on the host.
    fn to_cpu(&self, layout: &Layout) -> Result<crate::CpuStorage>;

    /// Elementwise `op`.
    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self>;
    /// Elementwise `op` of two inputs whose layouts have the same shape (broadcast already).
    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self>;
    /// Elementwise comparison; result dtype `Bool`.
    fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp) -> Result<Self>;
    /// `self` is a `Bool`/`U8` condition: picks `on_true` where nonzero, else `on_false`.
    fn where_cond(
        &self,
        layout: &Layout,
        on_true: &Self,
        true_layout: &Layout,
        on_false: &Self,
        false_layout: &Layout,
    ) -> Result<Self>;
    /// Reduces `dims` (sorted, unique); the output is contiguous with those dims of size 1.
    fn reduce(&self, layout: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self>;
    /// Batched matrix product: `layout` is `[..batch, m, k]`, `rhs_layout` `[..batch, k, n]` with
    /// identical batch dims (broadcast already, stride 0 allowed); output `[..batch, m, n]`.
    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self>;
    /// Softmax (or log-softmax) over the last dim.
    fn softmax_last_dim(&self, layout: &Layout, log: bool) -> Result<Self>;
    /// The elements of `layout`, contiguous.
    fn copy_contiguous(&self, layout: &Layout) -> Result<Self>;
    /// Writes the elements of `layout` into `dst` through `dst_layout` (same shape).
    fn copy_into(&self, layout: &Layout, dst: &mut Self, dst_layout: &Layout) -> Result<()>;
    /// The elements of `layout` converted to `dtype`, contiguous.
    fn to_dtype(&self, layout: &Layout, dtype: DType) -> Result<Self>;

    // ----- neural-network kernels (input shapes validated by the caller; the geometry types
    // check the parameters) -----

    /// `conv2d`: `self` is the input `[N, C_in, H, W]`, `weight` `[C_out, C_in/groups, kH, kW]`,
    /// `bias` `[C_out]`; output `[N, C_out, H_out, W_out]`.
    fn conv2d(
        &self,
        layout: &Layout,
        weight: Strided<'_, Self>,
        bias: Option<Strided<'_, Self>>,
        geometry: &Conv2dGeometry,
    ) -> Result<Self>;
    /// Gradients of `conv2d` from `self` = the output gradient: `[input, weight, bias]`.
    fn conv2d_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Strided<'_, Self>,
        geometry: &Conv2dGeometry,
        mask: GradMask,
    ) -> Result<Grads3<Self>>;
    /// A 2-D pooling of `self`; `Pool2d::Max` also returns its `I64` indices.
    fn pool2d(&self, layout: &Layout, pool: &Pool2d) -> Result<(Self, Option<Self>)>;
    /// Gradient of a 2-D pooling from `self` = the output gradient (`indices` for max pooling).
    fn pool2d_backward(
        &self,
        layout: &Layout,
        indices: Option<Strided<'_, Self>>,
        pool: &Pool2d,
    ) -> Result<Self>;
    /// Batch norm in training mode over `self` `[N, C, ...]`: returns the output and the saved
    /// batch `mean` and `rstd` (`[C]`), and updates `running` in place when given.
    fn batch_norm_train(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running: Option<RunningStatsMut<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]>;
    /// Batch norm in evaluation mode (normalises with the running statistics).
    fn batch_norm_eval(
        &self,
        layout: &Layout,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        running_mean: Strided<'_, Self>,
        running_var: Strided<'_, Self>,
        eps: f64,
    ) -> Result<Self>;
    /// Gradients of batch norm from `self` = the output gradient: `[input, weight, bias]`.
    fn batch_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Option<Strided<'_, Self>>,
        stats: BatchNormStats<'_, Self>,
        mask: GradMask,
    ) -> Result<Grads3<Self>>;
    /// Layer norm of `self` over its last `normalized_dims` dims (each leading index is one
    /// row): returns the output and the saved per-row `mean` and `rstd`.
    fn layer_norm(
        &self,
        layout: &Layout,
        normalized_dims: usize,
        weight: Option<Strided<'_, Self>>,
        bias: Option<Strided<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]>;
    /// Gradients of layer norm from `self` = the output gradient: `[input, weight, bias]`.
    fn layer_norm_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        normalized_dims: usize,
        weight: Option<Strided<'_, Self>>,
        saved: [Strided<'_, Self>; 2],
        mask: GradMask,
    ) -> Result<Grads3<Self>>;

    // ----- indexing kernels (indices are `I64`; each kernel checks every index value) -----

    /// `embedding`: rows of the table `self` `[num, dim]` picked by `indices` (any shape);
    /// output `[..indices.shape, dim]`.
    fn embedding(&self, layout: &Layout, indices: Strided<'_, Self>) -> Result<Self>;
    /// Gradient of the table from `self` = the output gradient, summed per index, none for
    /// `padding_idx` (already in `[0, num_embeddings)`).
    fn embedding_backward(
        &self,
        layout: &Layout,
        indices: Strided<'_, Self>,
        num_embeddings: usize,
        padding_idx: Option<i64>,
    ) -> Result<Self>;
    /// `index_select(self, dim, index)` with a 1-D `index`.
    fn index_select(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self>;
    /// Gradient of `index_select` from `self` = the output gradient: an index-add into zeros
    /// of `input_shape`.
    fn index_select_backward(
        &self,
        layout: &Layout,
        input_shape: &[usize],
        dim: usize,
        index: Strided<'_, Self>,
    ) -> Result<Self>;
    /// `gather(self, dim, index)`: the output has the index's shape.
    fn gather(&self, layout: &Layout, dim: usize, index: Strided<'_, Self>) -> Result<Self>;
    /// Out-of-place `scatter` (`accumulate = false`, last write wins) or `scatter_add`: a copy
    /// of `self` with `src` written (added) at `index` along `dim`.
    fn scatter(
        &self,
        layout: &Layout,
        dim: usize,
        index: Strided<'_, Self>,
        src: Strided<'_, Self>,
        accumulate: bool,
    ) -> Result<Self>;
    /// Fused softmax + cross-entropy over `[N, C, D]` logits (`layout`, contiguous or not):
    /// per-position losses, optionally their gradient, and the mean's denominator. `target` is
    /// `[N, D]` integers or `[N, C, D]` floats as `spec.target` says; `weight` is `[C]`. See
    /// [`crate::ops::loss`]. Devices without the kernel return `NotImplemented`.
    fn softmax_cross_entropy(
        &self,
        layout: &Layout,
        target: &Self,
        target_layout: &Layout,
        weight: Option<(&Self, &Layout)>,
        spec: &crate::ops::loss::CrossEntropySpec,
    ) -> Result<crate::ops::loss::CrossEntropyOutput<Self>> {
        let _ = (layout, target, target_layout, weight, spec);
        Err(crate::Error::NotImplemented {
            op: "cross_entropy",
            device: self.device(),
        })
    }
}
