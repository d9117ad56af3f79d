//! CUDA batch norm and layer norm, composed from the CUDA backend's own kernels.
//!
//! Each norm is a short sequence of device ops on a contiguous f32/f64 copy of the input (16-bit
//! floats widen to f32 and the outputs round back once, as the CPU's `float_kernel!` does):
//! per-row / per-channel sums from `reduce.cu` (double accumulators, deterministic), then
//! broadcasting elementwise ops from `elementwise.cu` (statistics broadcast with stride 0). No
//! data leaves the device and nothing waits on the stream. Layer norm views the input as
//! `[rows, cols]`, batch norm as `[N, C, S]`; the formulas are the CPU kernels' (biased variance
//! for normalising, unbiased for the running variance, `rstd = 1 / sqrt(var + eps)`).
//! A fused single-pass kernel per norm would save memory traffic; this composition trades that
//! for reusing kernels that are already checked against the CPU.

use super::{BatchNormShape, LayerNormShape};
use crate::backend::{
    BatchNormStats, BinaryOp, GradMask, Grads3, ReduceOp, RunningStatsMut, UnaryOp,
};
use crate::error::{Error, Result};
use crate::ops::kernel_error::KernelError;
use crate::storage::CudaStorage;
use crate::{BackendStorage, DType, Layout};

type View<'a> = (&'a CudaStorage, &'a Layout);

/// A contiguous buffer of `shape` with its layout.
struct T {
    s: CudaStorage,
    l: Layout,
}

impl T {
    fn new(s: CudaStorage, shape: &[usize]) -> Self {
        T {
            s,
            l: Layout::contiguous(shape),
        }
    }
    /// The same buffer read as `shape` with `strides` (a broadcast view).
    fn as_view(&self, shape: &[usize], strides: &[usize]) -> Layout {
        Layout::new(shape.to_vec(), strides.to_vec(), 0)
    }
}

/// The compute dtype of a norm over `dtype`.
fn compute_dtype(op: &'static str, dtype: DType) -> Result<DType> {
    match dtype {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        other => Err(Error::UnsupportedDType {
            op,
            dtype: other,
            hint: "this kernel runs on floating-point tensors; convert with to_dtype(DType::F32) \
                   first",
        }),
    }
}

/// `(storage, layout)` as contiguous `dt` of `shape` (must hold the same number of elements).
fn dense(op: &'static str, (s, l): View<'_>, dt: DType, shape: &[usize]) -> Result<T> {
    s.check_view(op, l)?;
    let want: usize = shape.iter().product();
    if l.numel() != want {
        return Err(Error::Kernel(KernelError::BufferLength {
            op,
            buffer: "operand",
            shape: shape.to_vec(),
            expected: want,
            actual: l.numel(),
        }));
    }
    Ok(T::new(s.cast_cuda(l, dt)?, shape))
}

fn bin(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    op: BinaryOp,
) -> Result<CudaStorage> {
    a.binary_cuda(la, b, lb, op)
}

/// `x op scalar` over `x`'s (contiguous) shape.
fn with_scalar(x: &T, v: f64, op: BinaryOp) -> Result<CudaStorage> {
    let s = CudaStorage::full_cuda(x.s.ordinal(), 1, v, x.s.dtype())?;
    let zeros = vec![0; x.l.rank()];
    bin(
        &x.s,
        &x.l,
        &s,
        &Layout::new(x.l.shape().to_vec(), zeros, 0),
        op,
    )
}

/// Sum over `dims` of a contiguous buffer, as a contiguous buffer of `out_shape`.
fn sum(x: &T, dims: &[usize], out_shape: &[usize]) -> Result<T> {
    Ok(T::new(
        x.s.reduce_cuda(&x.l, dims, ReduceOp::Sum)?,
        out_shape,
    ))
}

/// `1 / sqrt(var + eps)`.
fn rstd_of(var: &T, eps: f64) -> Result<T> {
    let shifted = T::new(with_scalar(var, eps, BinaryOp::Add)?, var.l.shape());
    Ok(T::new(
        shifted.s.unary_cuda(&shifted.l, UnaryOp::Rsqrt)?,
        var.l.shape(),
    ))
}

/// Rounds a compute-dtype result back to `out` dtype.
fn back(x: CudaStorage, out: DType) -> Result<CudaStorage> {
    if x.dtype() == out {
        Ok(x)
    } else {
        x.cast_cuda(&Layout::contiguous(&[x.len()]), out)
    }
}

/// The shape of a normalisation problem: `x` as `[outer, stat, inner]`-style dims, which dims
/// are reduced for the statistics, how statistics and the affine parameters broadcast.
struct Plan {
    /// The dims the input is viewed as.
    dims: Vec<usize>,
    /// Reduced dims (for per-statistic sums).
    reduced: Vec<usize>,
    /// Shape of one statistic vector (kept dims), contiguous.
    stat_shape: Vec<usize>,
    /// Strides broadcasting a statistic over `dims`.
    stat_strides: Vec<usize>,
    /// Strides broadcasting a weight/bias over `dims`.
    param_strides: Vec<usize>,
    /// Shape of the weight/bias.
    param_shape: Vec<usize>,
    /// Reduced dims for the weight/bias gradients.
    param_reduced: Vec<usize>,
    /// Elements per statistic.
    count: usize,
}

impl Plan {
    fn layer(s: &LayerNormShape) -> Self {
        Plan {
            dims: vec![s.rows, s.cols],
            reduced: vec![1],
            stat_shape: vec![s.rows],
            stat_strides: vec![1, 0],
            param_strides: vec![0, 1],
            param_shape: vec![s.cols],
            param_reduced: vec![0],
            count: s.cols,
        }
    }
    fn batch(s: &BatchNormShape) -> Self {
        Plan {
            dims: s.dims().to_vec(),
            reduced: vec![0, 2],
            stat_shape: vec![s.channels],
            stat_strides: vec![0, 1, 0],
            param_strides: vec![0, 1, 0],
            param_shape: vec![s.channels],
            param_reduced: vec![0, 2],
            count: s.count(),
        }
    }
    fn stat(&self, t: &T) -> Layout {
        t.as_view(&self.dims, &self.stat_strides)
    }
    fn param(&self, t: &T) -> Layout {
        t.as_view(&self.dims, &self.param_strides)
    }
    fn full(&self, s: CudaStorage) -> T {
        T::new(s, &self.dims)
    }

    /// `(x - mean) * rstd`, optionally `* weight + bias`.
    fn normalise(&self, x: &T, mean: &T, rstd: &T, w: Option<&T>, b: Option<&T>) -> Result<T> {
        let centred = self.full(bin(&x.s, &x.l, &mean.s, &self.stat(mean), BinaryOp::Sub)?);
        let mut y = self.full(bin(
            &centred.s,
            &centred.l,
            &rstd.s,
            &self.stat(rstd),
            BinaryOp::Mul,
        )?);
        if let Some(w) = w {
            y = self.full(bin(&y.s, &y.l, &w.s, &self.param(w), BinaryOp::Mul)?);
        }
        if let Some(b) = b {
            y = self.full(bin(&y.s, &y.l, &b.s, &self.param(b), BinaryOp::Add)?);
        }
        Ok(y)
    }

    /// Batch statistics: `(mean, biased var)`.
    fn moments(&self, x: &T) -> Result<(T, T)> {
        let inv = 1.0 / self.count as f64;
        let total = sum(x, &self.reduced, &self.stat_shape)?;
        let mean = T::new(with_scalar(&total, inv, BinaryOp::Mul)?, &self.stat_shape);
        let centred = self.full(bin(&x.s, &x.l, &mean.s, &self.stat(&mean), BinaryOp::Sub)?);
        let sq = self.full(centred.s.unary_cuda(&centred.l, UnaryOp::Square)?);
        let ss = sum(&sq, &self.reduced, &self.stat_shape)?;
        let var = T::new(with_scalar(&ss, inv, BinaryOp::Mul)?, &self.stat_shape);
        Ok((mean, var))
    }

    /// Gradients given `xhat`, the output gradient `go` and the per-statistic `rstd`:
    /// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` with `g = go * w` when `train`,
    /// else `dx = g * rstd`; `dw = sum(go * xhat)`, `db = sum(go)`.
    fn backward(
        &self,
        (go, xhat, rstd): (&T, &T, &T),
        w: Option<&T>,
        train: bool,
        mask: GradMask,
    ) -> Result<[Option<CudaStorage>; 3]> {
        let mut grads: [Option<CudaStorage>; 3] = [None, None, None];
        if mask[0] {
            let g = match w {
                Some(w) => self.full(bin(&go.s, &go.l, &w.s, &self.param(w), BinaryOp::Mul)?),
                None => self.full(go.s.cast_cuda(&go.l, go.s.dtype())?),
            };
            let dx = if train {
                let inv = 1.0 / self.count as f64;
                let mg = T::new(
                    with_scalar(
                        &sum(&g, &self.reduced, &self.stat_shape)?,
                        inv,
                        BinaryOp::Mul,
                    )?,
                    &self.stat_shape,
                );
                let gx = self.full(bin(&g.s, &g.l, &xhat.s, &xhat.l, BinaryOp::Mul)?);
                let mgx = T::new(
                    with_scalar(
                        &sum(&gx, &self.reduced, &self.stat_shape)?,
                        inv,
                        BinaryOp::Mul,
                    )?,
                    &self.stat_shape,
                );
                let t1 = self.full(bin(&g.s, &g.l, &mg.s, &self.stat(&mg), BinaryOp::Sub)?);
                let t2 = self.full(bin(
                    &xhat.s,
                    &xhat.l,
                    &mgx.s,
                    &self.stat(&mgx),
                    BinaryOp::Mul,
                )?);
                let t3 = self.full(bin(&t1.s, &t1.l, &t2.s, &t2.l, BinaryOp::Sub)?);
                bin(&t3.s, &t3.l, &rstd.s, &self.stat(rstd), BinaryOp::Mul)?
            } else {
                bin(&g.s, &g.l, &rstd.s, &self.stat(rstd), BinaryOp::Mul)?
            };
            grads[0] = Some(dx);
        }
        if mask[1] {
            let gx = self.full(bin(&go.s, &go.l, &xhat.s, &xhat.l, BinaryOp::Mul)?);
            grads[1] = Some(sum(&gx, &self.param_reduced, &self.param_shape)?.s);
        }
        if mask[2] {
            grads[2] = Some(sum(go, &self.param_reduced, &self.param_shape)?.s);
        }
        Ok(grads)
    }
}

fn opt(op: &'static str, v: Option<View<'_>>, dt: DType, shape: &[usize]) -> Result<Option<T>> {
    v.map(|v| dense(op, v, dt, shape)).transpose()
}

fn backs(grads: [Option<CudaStorage>; 3], out: DType) -> Result<Grads3<CudaStorage>> {
    let [a, b, c] = grads;
    Ok([
        a.map(|g| back(g, out)).transpose()?,
        b.map(|g| back(g, out)).transpose()?,
        c.map(|g| back(g, out)).transpose()?,
    ])
}

impl CudaStorage {
    /// Layer norm over the last `normalized_dims` dims: `[out, mean, rstd]`.
    pub(crate) fn layer_norm_cuda(
        &self,
        layout: &Layout,
        normalized_dims: usize,
        weight: Option<View<'_>>,
        bias: Option<View<'_>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        const OP: &str = "layer_norm";
        let shape = layout.shape();
        let k = normalized_dims.min(shape.len());
        let s = LayerNormShape::new(shape, &shape[shape.len() - k..])?;
        let dt = compute_dtype(OP, self.dtype())?;
        let plan = Plan::layer(&s);
        let x = dense(OP, (self, layout), dt, &plan.dims)?;
        let (w, b) = (
            opt(OP, weight, dt, &plan.param_shape)?,
            opt(OP, bias, dt, &plan.param_shape)?,
        );
        let (mean, var) = plan.moments(&x)?;
        let rstd = rstd_of(&var, eps)?;
        let y = plan.normalise(&x, &mean, &rstd, w.as_ref(), b.as_ref())?;
        let out = self.dtype();
        Ok([back(y.s, out)?, back(mean.s, out)?, back(rstd.s, out)?])
    }

    /// Gradients of layer norm from `self` = the output gradient.
    pub(crate) fn layer_norm_backward_cuda(
        &self,
        layout: &Layout,
        input: View<'_>,
        normalized_dims: usize,
        weight: Option<View<'_>>,
        saved: [View<'_>; 2],
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        const OP: &str = "layer_norm_backward";
        let shape = input.1.shape();
        let k = normalized_dims.min(shape.len());
        let s = LayerNormShape::new(shape, &shape[shape.len() - k..])?;
        let dt = compute_dtype(OP, self.dtype())?;
        let plan = Plan::layer(&s);
        let go = dense(OP, (self, layout), dt, &plan.dims)?;
        let x = dense(OP, input, dt, &plan.dims)?;
        let w = opt(OP, weight, dt, &plan.param_shape)?;
        let mean = dense(OP, saved[0], dt, &plan.stat_shape)?;
        let rstd = dense(OP, saved[1], dt, &plan.stat_shape)?;
        let xhat = plan.normalise(&x, &mean, &rstd, None, None)?;
        let grads = plan.backward((&go, &xhat, &rstd), w.as_ref(), true, mask)?;
        backs(grads, self.dtype())
    }

    /// Batch norm in training mode: `[out, mean, rstd]`, running statistics updated in place.
    pub(crate) fn batch_norm_train_cuda(
        &self,
        layout: &Layout,
        weight: Option<View<'_>>,
        bias: Option<View<'_>>,
        running: Option<RunningStatsMut<'_, Self>>,
        eps: f64,
    ) -> Result<[Self; 3]> {
        const OP: &str = "batch_norm";
        let s = BatchNormShape::from_input_shape(layout.shape())?;
        if s.count() < 2 && s.channels > 0 {
            return Err(KernelError::TooFewValuesPerChannel {
                op: OP,
                count: s.count(),
            }
            .into());
        }
        let dt = compute_dtype(OP, self.dtype())?;
        let plan = Plan::batch(&s);
        let x = dense(OP, (self, layout), dt, &plan.dims)?;
        let (w, b) = (
            opt(OP, weight, dt, &plan.param_shape)?,
            opt(OP, bias, dt, &plan.param_shape)?,
        );
        let (mean, var) = plan.moments(&x)?;
        let rstd = rstd_of(&var, eps)?;
        let y = plan.normalise(&x, &mean, &rstd, w.as_ref(), b.as_ref())?;
        if let Some(r) = running {
            let m = r.momentum;
            let n = s.count() as f64;
            let update =
                |(old, ol): (&mut CudaStorage, &Layout), stat: &T, scale: f64| -> Result<()> {
                    let old_t = dense(OP, (&*old, ol), dt, &plan.stat_shape)?;
                    let kept = T::new(
                        with_scalar(&old_t, 1.0 - m, BinaryOp::Mul)?,
                        &plan.stat_shape,
                    );
                    let add = T::new(
                        with_scalar(stat, m * scale, BinaryOp::Mul)?,
                        &plan.stat_shape,
                    );
                    let new = bin(&kept.s, &kept.l, &add.s, &add.l, BinaryOp::Add)?;
                    let new = back(new, old.dtype())?;
                    new.copy_into_cuda(&Layout::contiguous(&plan.stat_shape), old, ol)
                };
            update((r.mean.0, r.mean.1), &mean, 1.0)?;
            update((r.var.0, r.var.1), &var, n / (n - 1.0))?;
        }
        let out = self.dtype();
        Ok([back(y.s, out)?, back(mean.s, out)?, back(rstd.s, out)?])
    }

    /// Batch norm in evaluation mode (running statistics).
    pub(crate) fn batch_norm_eval_cuda(
        &self,
        layout: &Layout,
        weight: Option<View<'_>>,
        bias: Option<View<'_>>,
        running: [View<'_>; 2],
        eps: f64,
    ) -> Result<Self> {
        const OP: &str = "batch_norm";
        let s = BatchNormShape::from_input_shape(layout.shape())?;
        let dt = compute_dtype(OP, self.dtype())?;
        let plan = Plan::batch(&s);
        let x = dense(OP, (self, layout), dt, &plan.dims)?;
        let (w, b) = (
            opt(OP, weight, dt, &plan.param_shape)?,
            opt(OP, bias, dt, &plan.param_shape)?,
        );
        let mean = dense(OP, running[0], dt, &plan.stat_shape)?;
        let var = dense(OP, running[1], dt, &plan.stat_shape)?;
        let rstd = rstd_of(&var, eps)?;
        let y = plan.normalise(&x, &mean, &rstd, w.as_ref(), b.as_ref())?;
        back(y.s, self.dtype())
    }

    /// Gradients of batch norm from `self` = the output gradient.
    pub(crate) fn batch_norm_backward_cuda(
        &self,
        layout: &Layout,
        input: View<'_>,
        weight: Option<View<'_>>,
        stats: BatchNormStats<'_, Self>,
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        const OP: &str = "batch_norm_backward";
        let s = BatchNormShape::from_input_shape(input.1.shape())?;
        let dt = compute_dtype(OP, self.dtype())?;
        let plan = Plan::batch(&s);
        let go = dense(OP, (self, layout), dt, &plan.dims)?;
        let x = dense(OP, input, dt, &plan.dims)?;
        let w = opt(OP, weight, dt, &plan.param_shape)?;
        let (mean, rstd, train) = match stats {
            BatchNormStats::Batch { mean, rstd } => (
                dense(OP, mean, dt, &plan.stat_shape)?,
                dense(OP, rstd, dt, &plan.stat_shape)?,
                true,
            ),
            BatchNormStats::Running { mean, var, eps } => {
                let var = dense(OP, var, dt, &plan.stat_shape)?;
                (
                    dense(OP, mean, dt, &plan.stat_shape)?,
                    rstd_of(&var, eps)?,
                    false,
                )
            }
        };
        let xhat = plan.normalise(&x, &mean, &rstd, None, None)?;
        let grads = plan.backward((&go, &xhat, &rstd), w.as_ref(), train, mask)?;
        backs(grads, self.dtype())
    }
}
