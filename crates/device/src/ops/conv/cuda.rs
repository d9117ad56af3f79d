//! CUDA conv2d, forward and backward: im2col / col2im kernels (`conv.cu`) around cuBLAS GEMMs.
//!
//! With `K = C_in/groups * kH * kW` and `L = H_out * W_out`, the input becomes one column
//! matrix `cols` `[N, C_in*kH*kW, L]` (group `g` owns rows `g*K ..`), and per group:
//! - forward: `out[n, g] = W_g [C_out/g, K] @ cols[n, g] [K, L]`, one strided-batched GEMM
//!   with the weight broadcast over the batch (stride 0), then `+ bias`;
//! - input gradient: `dcols[n, g] = W_gᵀ @ grad[n, g]` (the transposed weight is read in place),
//!   then `col2im` gathers every column element back to its input pixel (no atomics);
//! - weight gradient: `grad` as `[C_out, N*L]` times `cols` as `[N*L, K]` (the gradient a
//!   permuted copy, the columns unfolded straight into `[C_in*kH*kW, N, L]` by `im2col_t`, so the
//!   batch sum happens inside one GEMM), and the bias gradient is a sum over `N, L`.
//!
//! **Dtypes.** Every pass runs in the tensor's own dtype: no widening copy. GEMMs go through
//! `CudaStorage::matmul_cuda` (cuBLAS; f16/bf16 operands with f32 compute, so bf16 autocast
//! convolutions use the tensor cores), im2col only moves values, col2im adds its taps in an f32
//! register and rounds once, and the bias gradient is `reduce.cu`'s sum (double accumulator,
//! rounded once). Contiguous operands are read in place; other views are copied contiguous
//! first. Groups > 1 run one GEMM per group and place the blocks with `copy_into`.
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

use super::Conv2dGeometry;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error, suffix};
use crate::error::{Error, Result};
use crate::ops::copy::CopyOps;
use crate::ops::elementwise::{BinaryOp, ElementwiseOps};
use crate::ops::matmul::MatmulOps;
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

/// Launches `kiln_{im2col,im2col_t,col2im}_<t>` writing `total` elements of `dst` from `src`.
fn launch(
    kind: &str,
    src: &CudaStorage,
    g: &Conv2dGeometry,
    dst: &CudaStorage,
    total: usize,
) -> Result<()> {
    if total == 0 {
        return Ok(());
    }
    let name = kernel_name(kind, src.dtype())?;
    let stream = crate::storage::cuda_stream(src.ordinal())?;
    let f = function(&stream, &CONV_KERNELS, &name)?;
    let (a, s, d, n) = (
        conv_args(g),
        src.device_ptr(),
        dst.device_ptr(),
        total as u64,
    );
    let mut b = stream.launch_builder(&f);
    b.arg(&s).arg(&a).arg(&d).arg(&n);
    // SAFETY: signature (const T*, ConvArgs, T*, u64) as in conv.cu; `src` is the contiguous
    // [N, C, H, W] input (im2col, im2col_t) or [N, C*kH*kW, L] columns (col2im) of the
    // geometry, `dst` holds `total` elements of the other ([C*kH*kW, N, L] for im2col_t).
    unsafe { b.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
    Ok(())
}

/// The result of a GEMM per group: with one group its block is the result (no buffer, no
/// copy); with several, a new buffer of `total` elements, each group's block (contiguous
/// `block_shape`) computed by `block` and copied in through `place(group)`, one block alive at a
/// time. The forward, the column gradient and the weight gradient all assemble their groups
/// this way (what `workspace.rs` counts).
fn join_groups(
    ordinal: usize,
    dtype: DType,
    groups: usize,
    (total, block_shape): (usize, &[usize]),
    block: impl Fn(usize) -> Result<CudaStorage>,
    place: impl Fn(usize) -> Layout,
) -> Result<CudaStorage> {
    if groups == 1 {
        return block(0);
    }
    let (_, mut out) = CudaStorage::output(ordinal, total, dtype)?;
    let src = Layout::contiguous(block_shape);
    for gi in 0..groups {
        block(gi)?.copy_into(&src, &mut out, &place(gi))?;
    }
    Ok(out)
}

impl CudaStorage {
    /// `[N, C_in*kH*kW, L]` columns of the contiguous input `x`; with `batch_inner`, the same
    /// values as `[C_in*kH*kW, N, L]`.
    fn im2col(x: &CudaStorage, g: &Conv2dGeometry, batch_inner: bool) -> Result<CudaStorage> {
        let d = dims(g)?;
        let total = g.batch * d.rows * d.l;
        let (_, cols) = CudaStorage::output(x.ordinal(), total, x.dtype())?;
        let kind = if batch_inner { "im2col_t" } else { "im2col" };
        launch(kind, x, g, &cols, total)?;
        Ok(cols)
    }
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
        let (n, cout) = (g.batch, g.out_channels);
        let out_shape = [n, cout, d.l];
        // The columns live only through the GEMMs; the bias is added in place.
        let mut y = {
            let x = dense(OP, (self, layout), self.dtype(), &g.input_shape())?;
            let w = dense(OP, weight, self.dtype(), &g.weight_shape())?;
            let cols = CudaStorage::im2col(&x, g, false)?;
            let group_block = |gi: usize| {
                let wl = Layout::new(vec![n, d.cout_g, d.k], vec![0, d.k, 1], gi * d.cout_g * d.k);
                let cl = Layout::new(
                    vec![n, d.k, d.l],
                    vec![d.rows * d.l, d.l, 1],
                    gi * d.k * d.l,
                );
                w.matmul(&wl, &cols, &cl)
            };
            let place = |gi: usize| {
                Layout::new(
                    out_shape.to_vec(),
                    vec![cout * d.l, d.l, 1],
                    gi * d.cout_g * d.l,
                )
                .narrow(1, 0, d.cout_g)
            };
            let (total, block_shape) = (n * cout * d.l, [n, d.cout_g, d.l]);
            join_groups(
                self.ordinal(),
                dt,
                d.groups,
                (total, &block_shape),
                group_block,
                place,
            )?
        };
        if let Some(b) = bias {
            let b = dense(OP, b, self.dtype(), &[cout])?;
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
        let (n, cout) = (g.batch, g.out_channels);
        let go = dense(OP, (self, layout), self.dtype(), &g.output_shape())?;
        let mut grads = InputGrads::default();
        if mask.input {
            let w = dense(OP, weight, self.dtype(), &g.weight_shape())?;
            // W_gᵀ [K, C_out/g] (column-major in place), broadcast over the batch, times the
            // group's output gradient.
            let group_block = |gi: usize| {
                let wt = Layout::new(vec![n, d.k, d.cout_g], vec![0, 1, d.k], gi * d.cout_g * d.k);
                let gl = Layout::new(
                    vec![n, d.cout_g, d.l],
                    vec![cout * d.l, d.l, 1],
                    gi * d.cout_g * d.l,
                );
                w.matmul(&wt, &go, &gl)
            };
            let place = |gi: usize| {
                Layout::new(
                    vec![n, d.k, d.l],
                    vec![d.rows * d.l, d.l, 1],
                    gi * d.k * d.l,
                )
            };
            let (total, block_shape) = (n * d.rows * d.l, [n, d.k, d.l]);
            let dcols = join_groups(
                self.ordinal(),
                dt,
                d.groups,
                (total, &block_shape),
                group_block,
                place,
            )?;
            let total = g.input_shape().iter().product();
            let (_, dx) = CudaStorage::output(self.ordinal(), total, dt)?;
            launch("col2im", &dcols, g, &dx, total)?;
            grads.input = Some(dx);
        }
        if mask.weight {
            // grad as [C_out, N*L] and cols as [rows, N*L]: the batch sum runs inside the GEMM.
            let cols_t = {
                let x = dense(OP, input, self.dtype(), &g.input_shape())?;
                CudaStorage::im2col(&x, g, true)?
            };
            let go_t = go.to_dtype(&Layout::contiguous(&[n, cout, d.l]).permute(&[1, 0, 2]), dt)?;
            let nl = n * d.l;
            let group_block = |gi: usize| {
                let a = Layout::new(vec![d.cout_g, nl], vec![nl, 1], gi * d.cout_g * nl);
                let b = Layout::new(vec![nl, d.k], vec![1, nl], gi * d.k * nl);
                go_t.matmul(&a, &cols_t, &b)
            };
            let place =
                |gi: usize| Layout::new(vec![d.cout_g, d.k], vec![d.k, 1], gi * d.cout_g * d.k);
            let (total, block_shape) = (cout * d.k, [d.cout_g, d.k]);
            let dw = join_groups(
                self.ordinal(),
                dt,
                d.groups,
                (total, &block_shape),
                group_block,
                place,
            )?;
            grads.weight = Some(dw);
        }
        if mask.bias {
            let gl = Layout::contiguous(&[n, cout, d.l]);
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
