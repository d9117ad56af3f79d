//! CUDA conv2d, forward and backward: im2col / col2im kernels (`conv.cu`) around cuBLAS GEMMs.
//!
//! With `K = C_in/groups * kH * kW` and `L = H_out * W_out`, each pass works through the batch
//! in chunks of `n` images, as many as fit the column budget (`workspace.rs`,
//! [`super::cuda_conv_column_budget`]; at least one), so its scratch stops growing with the
//! batch. A chunk's input becomes one column matrix `cols` `[n, C_in*kH*kW, L]` (group `g` owns
//! rows `g*K ..`), and per group one strided-batched GEMM writes straight into the group's rows
//! of the result (`gemm_into`: no per-group block, no copy):
//! - forward: `out[i, g] = W_g [C_out/g, K] @ cols[i, g] [K, L]` with the weight broadcast over
//!   the chunk (stride 0), then `+ bias` in place over the whole output;
//! - input gradient: `dcols[i, g] = W_gᵀ @ grad[i, g]` (the transposed weight is read in place),
//!   then `col2im` gathers every column element back to its input pixel (no atomics) into the
//!   chunk's images of the input gradient;
//! - weight gradient: the chunk's `grad` as `[C_out, n*L]` (a permuted copy) times its `cols` as
//!   `[n*L, K]` (unfolded straight into `[C_in*kH*kW, n, L]` by `im2col_t`), so the sum over the
//!   chunk's images happens inside one GEMM and the sum over chunks in cuBLAS's `beta = 1`
//!   (16-bit weights accumulate in an f32 buffer, rounded once at the end); the bias gradient
//!   is a sum over `N, L`.
//!
//! Chunks change no result bit of the output or the input gradient (the same per-image GEMMs);
//! the weight gradient's f32 sums run in another order.
//!
//! **Dtypes.** Every pass runs in the tensor's own dtype: no widening copy. GEMMs go through
//! `CudaStorage::matmul_cuda` (cuBLAS; f16/bf16 operands with f32 compute, so bf16 autocast
//! convolutions use the tensor cores), im2col only moves values, col2im adds its taps in an f32
//! register and rounds once, and the bias gradient is `reduce.cu`'s sum (double accumulator,
//! rounded once). Contiguous operands are read in place; other views are copied contiguous
//! first.
//!
//! **Against the CPU** (which widens 16-bit operands to f32, computes everything in f32 and
//! rounds each result once): the weight and bias gradients round once here too (products of the
//! same rounded inputs, f32 sums in another order). Two results round an intermediate as well:
//! the forward output rounds the GEMM result and then `+ bias` (two roundings), and the input
//! gradient sums up to `kH*kW` column gradients that the GEMM already rounded to 16 bits. An
//! intermediate's rounding error is relative to its own magnitude, which can exceed the final
//! sum's after cancellation, so the GPU tests compare 16-bit convolutions with
//! [`crate::testing::sum_tolerance`] (the dtype's tolerance with `atol` scaled by the length of
//! the reduction), f32/f64 with [`crate::testing::tolerance`].

use super::ConvOps;
use std::ops::Deref;

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::workspace::cuda_conv_images_per_chunk;
use super::Conv2dGeometry;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error, suffix};
use crate::error::{Error, Result};
use crate::ops::copy::CopyOps;
use crate::ops::elementwise::{BinaryOp, ElementwiseOps};
use crate::ops::matmul::cuda::GemmOut;
use crate::ops::reduce::{ReduceOp, ReduceOps};
use crate::seam::{GradMask, InputGrads, Strided};
use crate::storage::CudaStorage;
use crate::{DType, Layout};

/// The kernels of this op family.
pub const CONV_KERNELS: KernelSource = KernelSource {
    file: "ops/conv/conv.cu",
    source: include_str!("conv.cu"),
};

/// The geometry as the kernels receive it (matches `struct ConvArgs` in conv.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ConvArgs {
    n: u64,
    c: u64,
    h: u64,
    w: u64,
    kh: u64,
    kw: u64,
    oh: u64,
    ow: u64,
    sh: u64,
    sw: u64,
    ph: u64,
    pw: u64,
    dh: u64,
    dw: u64,
}

// SAFETY: plain `#[repr(C)]` integers with the same layout as the CUDA struct.
unsafe impl DeviceRepr for ConvArgs {}

fn conv_args(g: &Conv2dGeometry) -> ConvArgs {
    let p = g.params;
    let u = |v: usize| v as u64;
    ConvArgs {
        n: u(g.batch),
        c: u(g.in_channels),
        h: u(g.input_size[0]),
        w: u(g.input_size[1]),
        kh: u(g.kernel_size[0]),
        kw: u(g.kernel_size[1]),
        oh: u(g.output_size[0]),
        ow: u(g.output_size[1]),
        sh: u(p.stride[0]),
        sw: u(p.stride[1]),
        ph: u(p.padding[0]),
        pw: u(p.padding[1]),
        dh: u(p.dilation[0]),
        dw: u(p.dilation[1]),
    }
}

/// The sizes every pass uses: groups, per-group K and C_out, L, and the full column rows.
struct Dims {
    groups: usize,
    k: usize,
    cout_g: usize,
    l: usize,
    rows: usize,
}

/// The GEMM sizes of `g`, and (checked) the largest buffer any of its launches allocates: the
/// `[N, C_in*kH*kW, L]` columns, sized from the input, so they must not wrap.
fn dims(g: &Conv2dGeometry) -> Result<Dims> {
    const OP: &str = "conv2d";
    let groups = g.params.groups;
    let size = |what: &str, factors: &[usize]| crate::checked_size(OP, what, factors);
    let k = size(
        "the columns per group",
        &[g.in_channels / groups, g.kernel_size[0], g.kernel_size[1]],
    )?;
    let l = size("the output positions", &g.output_size)?;
    let rows = size("the columns' rows", &[k, groups])?;
    size("the unfolded input (im2col columns)", &[g.batch, rows, l])?;
    size("the output", &[g.batch, g.out_channels, l])?;
    Ok(Dims {
        groups,
        k,
        cout_g: g.out_channels / groups,
        l,
        rows,
    })
}

/// `kiln_<kind>_<t>`: the conv.cu kernel (`kind` is `im2col`, `im2col_t` or `col2im`) for
/// `dtype`'s elements.
pub(crate) fn kernel_name(kind: &str, dtype: DType) -> Result<String> {
    check_dtype("conv2d", dtype)?;
    Ok(format!("kiln_{kind}_{}", suffix(dtype)))
}

/// Convolutions run on the four float dtypes, each in its own precision.
fn check_dtype(op: &'static str, dtype: DType) -> Result<DType> {
    match dtype {
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 => Ok(dtype),
        other => Err(Error::UnsupportedDType {
            op,
            dtype: other,
            hint: "this kernel runs on floating-point tensors; convert with to_dtype(DType::F32) \
                   first",
        }),
    }
}

/// An operand as a contiguous buffer: the caller's storage, or a contiguous copy of its view
/// (shared with the pooling and norm launchers).
pub(crate) enum Dense<'a> {
    /// The storage itself: the view was contiguous from element 0.
    View(&'a CudaStorage),
    /// A contiguous copy of the view, in the same dtype.
    Copy(CudaStorage),
}

impl<'a> Dense<'a> {
    /// `s` read through `l` as a contiguous buffer (copied only when it is not one already).
    pub(crate) fn of(s: &'a CudaStorage, l: &Layout) -> Result<Self> {
        if l.is_contiguous() && l.offset() == 0 {
            Ok(Dense::View(s))
        } else {
            Ok(Dense::Copy(s.to_dtype(l, s.dtype())?))
        }
    }
}

impl Deref for Dense<'_> {
    type Target = CudaStorage;
    fn deref(&self) -> &CudaStorage {
        match self {
            Dense::View(s) => s,
            Dense::Copy(s) => s,
        }
    }
}

/// A view holding exactly `shape`'s elements as a contiguous buffer: the storage itself when
/// the view already is one, else a contiguous copy.
/// Every operand must have `want_dtype`, the input's (the kernels read them as one type).
fn dense<'a>(
    op: &'static str,
    (s, l): Strided<'a, CudaStorage>,
    want_dtype: DType,
    shape: &[usize],
) -> Result<Dense<'a>> {
    s.check_view(op, l)?;
    if s.dtype() != want_dtype {
        return Err(Error::DTypeMismatch {
            op,
            lhs: want_dtype,
            rhs: s.dtype(),
        });
    }
    if l.shape() != shape {
        return Err(Error::LengthMismatch {
            op,
            what: format!(
                "operand shape {:?} does not match the geometry's {shape:?}",
                l.shape()
            ),
        });
    }
    Dense::of(s, l)
}

/// Launches `kiln_{im2col,im2col_t,col2im}_<t>` for the images of `g` (a chunk of the batch),
/// reading `src` from element `src_at` and writing `total` elements of `dst` from `dst_at`.
fn launch(
    kind: &str,
    (src, src_at): (&CudaStorage, usize),
    g: &Conv2dGeometry,
    (dst, dst_at): (&CudaStorage, usize),
    total: usize,
) -> Result<()> {
    if total == 0 {
        return Ok(());
    }
    let name = kernel_name(kind, src.dtype())?;
    let stream = crate::storage::cuda_stream(src.ordinal())?;
    let f = function(&stream, &CONV_KERNELS, &name)?;
    let elem = src.dtype().size_in_bytes() as u64;
    let (a, s, d, n) = (
        conv_args(g),
        src.device_ptr() + src_at as u64 * elem,
        dst.device_ptr() + dst_at as u64 * elem,
        total as u64,
    );
    let mut b = stream.launch_builder(&f);
    b.arg(&s).arg(&a).arg(&d).arg(&n);
    // SAFETY: signature (const T*, ConvArgs, T*, u64) as in conv.cu; from their offsets, `src`
    // holds the contiguous [N, C, H, W] input (im2col, im2col_t) or [N, C*kH*kW, L] columns
    // (col2im) of `g`'s images, `dst` the `total` elements of the other ([C*kH*kW, N, L] for
    // im2col_t): the callers size the buffers and offsets from the same geometry.
    unsafe { b.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
    Ok(())
}

/// The batch in chunks of at most `per_chunk` images: `(first image, geometry of the chunk)`.
fn chunks(
    g: &Conv2dGeometry,
    per_chunk: usize,
) -> impl Iterator<Item = (usize, Conv2dGeometry)> + '_ {
    (0..g.batch).step_by(per_chunk.max(1)).map(move |first| {
        let chunk = Conv2dGeometry {
            batch: per_chunk.min(g.batch - first),
            ..*g
        };
        (first, chunk)
    })
}

/// The columns of the images of `chunk` in the contiguous input `x` from image `first`:
/// `[n, C_in*kH*kW, L]`, or with `batch_inner` the same values as `[C_in*kH*kW, n, L]`.
fn im2col(
    x: &CudaStorage,
    first: usize,
    chunk: &Conv2dGeometry,
    batch_inner: bool,
) -> Result<CudaStorage> {
    let d = dims(chunk)?;
    let total = chunk.batch * d.rows * d.l;
    let image = chunk.in_channels * chunk.input_size[0] * chunk.input_size[1];
    let (_, cols) = CudaStorage::output(x.ordinal(), total, x.dtype())?;
    let kind = if batch_inner { "im2col_t" } else { "im2col" };
    launch(kind, (x, first * image), chunk, (&cols, 0), total)?;
    Ok(cols)
}

impl ConvOps for CudaStorage {
    /// `conv2d` of the view `layout` of `self`.
    fn conv2d(
        &self,
        layout: &Layout,
        weight: Strided<'_, Self>,
        bias: Option<Strided<'_, Self>>,
        g: &Conv2dGeometry,
    ) -> Result<Self> {
        const OP: &str = "conv2d";
        let dt = check_dtype(OP, self.dtype())?;
        let d = dims(g)?;
        let cout = g.out_channels;
        let out_shape = [g.batch, cout, d.l];
        let (_, mut y) = CudaStorage::output(self.ordinal(), g.batch * cout * d.l, dt)?;
        {
            let x = dense(OP, (self, layout), dt, &g.input_shape())?;
            let w = dense(OP, weight, dt, &g.weight_shape())?;
            for (first, chunk) in chunks(g, cuda_conv_images_per_chunk(g, dt)?) {
                // The chunk's columns live only through its GEMMs, which write straight into
                // the output's rows of each group.
                let cols = im2col(&x, first, &chunk, false)?;
                let n = chunk.batch;
                for gi in 0..d.groups {
                    let wl =
                        Layout::new(vec![n, d.cout_g, d.k], vec![0, d.k, 1], gi * d.cout_g * d.k);
                    let cl = Layout::new(
                        vec![n, d.k, d.l],
                        vec![d.rows * d.l, d.l, 1],
                        gi * d.k * d.l,
                    );
                    let out = GemmOut {
                        buf: &y,
                        offset: (first * cout + gi * d.cout_g) * d.l,
                        ld: d.l,
                        batch_stride: cout * d.l,
                        accumulate: false,
                    };
                    w.gemm_into(&wl, &cols, &cl, out)?;
                }
            }
        }
        if let Some(b) = bias {
            let b = dense(OP, b, dt, &[cout])?;
            let yl = Layout::contiguous(&out_shape);
            let bl = Layout::new(out_shape.to_vec(), vec![0, 1, 0], 0);
            b.binary_into(&bl, &mut y, &yl, BinaryOp::Add)?;
        }
        Ok(y)
    }
    /// Gradients of `conv2d` from `self` = the output gradient.
    fn conv2d_backward(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Strided<'_, Self>,
        g: &Conv2dGeometry,
        mask: GradMask,
    ) -> Result<InputGrads<Self>> {
        const OP: &str = "conv2d_backward";
        let dt = check_dtype(OP, self.dtype())?;
        let d = dims(g)?;
        let cout = g.out_channels;
        let per_chunk = cuda_conv_images_per_chunk(g, dt)?;
        let go = dense(OP, (self, layout), dt, &g.output_shape())?;
        let mut grads = InputGrads::default();
        if mask.input {
            let w = dense(OP, weight, dt, &g.weight_shape())?;
            let image = g.in_channels * g.input_size[0] * g.input_size[1];
            let (_, dx) = CudaStorage::output(self.ordinal(), g.batch * image, dt)?;
            for (first, chunk) in chunks(g, per_chunk) {
                let n = chunk.batch;
                let (_, dcols) = CudaStorage::output(self.ordinal(), n * d.rows * d.l, dt)?;
                // W_gᵀ [K, C_out/g] (column-major in place), broadcast over the chunk, times the
                // group's output gradient, into the group's rows of the column gradient.
                for gi in 0..d.groups {
                    let wt =
                        Layout::new(vec![n, d.k, d.cout_g], vec![0, 1, d.k], gi * d.cout_g * d.k);
                    let gl = Layout::new(
                        vec![n, d.cout_g, d.l],
                        vec![cout * d.l, d.l, 1],
                        (first * cout + gi * d.cout_g) * d.l,
                    );
                    let out = GemmOut {
                        buf: &dcols,
                        offset: gi * d.k * d.l,
                        ld: d.l,
                        batch_stride: d.rows * d.l,
                        accumulate: false,
                    };
                    w.gemm_into(&wt, &go, &gl, out)?;
                }
                launch(
                    "col2im",
                    (&dcols, 0),
                    &chunk,
                    (&dx, first * image),
                    n * image,
                )?;
            }
            grads.input = Some(dx);
        }
        if mask.weight {
            // Per chunk, the gradient as [C_out, n*L] and the columns as [rows, n*L]: the sum
            // over the chunk's images runs inside one GEMM, the sum over chunks in cuBLAS's
            // beta = 1. 16-bit weights sum into an f32 buffer, rounded once at the end.
            let wide = matches!(dt, DType::F16 | DType::BF16);
            let acc_dtype = if wide { DType::F32 } else { dt };
            let acc = if g.batch == 0 {
                // No image, no chunk: the gradient is an empty sum.
                CudaStorage::full_cuda(self.ordinal(), cout * d.k, 0.0, acc_dtype)?
            } else {
                CudaStorage::output(self.ordinal(), cout * d.k, acc_dtype)?.1
            };
            let x = dense(OP, input, dt, &g.input_shape())?;
            for (i, (first, chunk)) in chunks(g, per_chunk).enumerate() {
                let n = chunk.batch;
                let cols_t = im2col(&x, first, &chunk, true)?;
                let go_t = go.to_dtype(
                    &Layout::contiguous(&[g.batch, cout, d.l])
                        .narrow(0, first, n)
                        .permute(&[1, 0, 2]),
                    dt,
                )?;
                let nl = n * d.l;
                for gi in 0..d.groups {
                    let a = Layout::new(vec![d.cout_g, nl], vec![nl, 1], gi * d.cout_g * nl);
                    let b = Layout::new(vec![nl, d.k], vec![1, nl], gi * d.k * nl);
                    let out = GemmOut {
                        buf: &acc,
                        offset: gi * d.cout_g * d.k,
                        ld: d.k,
                        batch_stride: d.cout_g * d.k,
                        accumulate: i > 0,
                    };
                    go_t.gemm_into(&a, &cols_t, &b, out)?;
                }
            }
            grads.weight = Some(if wide {
                acc.to_dtype(&Layout::contiguous(&[cout * d.k]), dt)?
            } else {
                acc
            });
        }
        if mask.bias {
            let gl = Layout::contiguous(&[g.batch, cout, d.l]);
            let db = go.reduce(&gl, &[0, 2], ReduceOp::Sum)?;
            grads.bias = Some(db);
        }
        Ok(grads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_follow_the_dtype_and_reject_non_floats() {
        assert_eq!(
            kernel_name("im2col", DType::BF16).unwrap(),
            "kiln_im2col_bf16"
        );
        assert_eq!(
            kernel_name("col2im", DType::F16).unwrap(),
            "kiln_col2im_f16"
        );
        assert_eq!(
            kernel_name("im2col", DType::F32).unwrap(),
            "kiln_im2col_f32"
        );
        assert_eq!(
            kernel_name("col2im", DType::F64).unwrap(),
            "kiln_col2im_f64"
        );
        assert_eq!(
            kernel_name("im2col_t", DType::F16).unwrap(),
            "kiln_im2col_t_f16"
        );
        assert!(matches!(
            kernel_name("im2col", DType::U8),
            Err(Error::UnsupportedDType { .. })
        ));
    }
}
