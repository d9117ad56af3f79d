//! CUDA conv2d, forward and backward: im2col / col2im kernels (`conv.cu`) around cuBLAS GEMMs.
//!
//! With `K = C_in/groups * kH * kW` and `L = H_out * W_out`, the input becomes one column
//! matrix `cols` `[N, C_in*kH*kW, L]` (group `g` owns rows `g*K ..`), and per group:
//! - forward: `out[n, g] = W_g [C_out/g, K] @ cols[n, g] [K, L]`, one strided-batched GEMM
//!   with the weight broadcast over the batch (stride 0), then `+ bias`;
//! - input gradient: `dcols[n, g] = W_gᵀ @ grad[n, g]` (the transposed weight is read in place),
//!   then `col2im` gathers every column element back to its input pixel (no atomics);
//! - weight gradient: `grad` as `[C_out, N*L]` times `cols` as `[N*L, K]` (both permuted copies,
//!   so the batch sum happens inside one GEMM), and the bias gradient is a sum over `N, L`.
//!
//! GEMMs go through [`CudaStorage::matmul_cuda`] (cuBLAS, f32/f64 compute); 16-bit convolutions
//! widen to f32 and round their results once, as the CPU side does. Groups > 1 run one GEMM per
//! group and place the blocks with `copy_into`.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::Conv2dGeometry;
use crate::backend::{BinaryOp, GradMask, Grads3, ReduceOp, Strided};
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::{BackendStorage, DType, Layout};

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

fn dims(g: &Conv2dGeometry) -> Dims {
    let groups = g.params.groups;
    let k = g.in_channels / groups * g.kernel_size[0] * g.kernel_size[1];
    Dims {
        groups,
        k,
        cout_g: g.out_channels / groups,
        l: g.output_size[0] * g.output_size[1],
        rows: k * groups,
    }
}

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

/// A contiguous `dt` copy of a view holding exactly `shape`'s elements.
fn dense(
    op: &'static str,
    (s, l): Strided<'_, CudaStorage>,
    dt: DType,
    shape: &[usize],
) -> Result<CudaStorage> {
    s.check_view(op, l)?;
    if l.shape() != shape {
        return Err(Error::LengthMismatch {
            op,
            what: format!(
                "operand shape {:?} does not match the geometry's {shape:?}",
                l.shape()
            ),
        });
    }
    s.cast_cuda(l, dt)
}

/// Launches `kiln_{im2col,col2im}_<t>` writing `total` elements of `dst` from `src`.
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
    let suffix = if src.dtype() == DType::F64 {
        "f64"
    } else {
        "f32"
    };
    let name = format!("kiln_{kind}_{suffix}");
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
    // [N, C, H, W] input (im2col) or [N, C*kH*kW, L] columns (col2im) of the geometry, `dst`
    // holds `total` elements of the other.
    unsafe { b.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
    Ok(())
}

fn back(x: CudaStorage, out: DType) -> Result<CudaStorage> {
    if x.dtype() == out {
        Ok(x)
    } else {
        x.cast_cuda(&Layout::contiguous(&[x.len()]), out)
    }
}

impl CudaStorage {
    /// `[N, C_in*kH*kW, L]` columns of the contiguous input `x`.
    fn im2col(x: &CudaStorage, g: &Conv2dGeometry) -> Result<CudaStorage> {
        let d = dims(g);
        let total = g.batch * d.rows * d.l;
        let (_, cols) = CudaStorage::output(x.ordinal(), total, x.dtype())?;
        launch("im2col", x, g, &cols, total)?;
        Ok(cols)
    }

    /// `conv2d` of the view `layout` of `self`.
    pub(crate) fn conv2d_cuda(
        &self,
        layout: &Layout,
        weight: Strided<'_, Self>,
        bias: Option<Strided<'_, Self>>,
        g: &Conv2dGeometry,
    ) -> Result<Self> {
        const OP: &str = "conv2d";
        let dt = compute_dtype(OP, self.dtype())?;
        let d = dims(g);
        let x = dense(OP, (self, layout), dt, &g.input_shape())?;
        let w = dense(OP, weight, dt, &g.weight_shape())?;
        let cols = CudaStorage::im2col(&x, g)?;
        let (n, cout) = (g.batch, g.out_channels);
        let out_shape = [n, cout, d.l];
        let mut out = if d.groups == 1 {
            None
        } else {
            Some(CudaStorage::output(self.ordinal(), n * cout * d.l, dt)?.1)
        };
        let mut single = None;
        for gi in 0..d.groups {
            let wl = Layout::new(vec![n, d.cout_g, d.k], vec![0, d.k, 1], gi * d.cout_g * d.k);
            let cl = Layout::new(
                vec![n, d.k, d.l],
                vec![d.rows * d.l, d.l, 1],
                gi * d.k * d.l,
            );
            let block = w.matmul_cuda(&wl, &cols, &cl)?;
            match &mut out {
                None => single = Some(block),
                Some(o) => {
                    let dst = Layout::new(
                        out_shape.to_vec(),
                        vec![cout * d.l, d.l, 1],
                        gi * d.cout_g * d.l,
                    )
                    .narrow(1, 0, d.cout_g);
                    block.copy_into_cuda(&Layout::contiguous(&[n, d.cout_g, d.l]), o, &dst)?;
                }
            }
        }
        let mut y = match out {
            Some(o) => o,
            None => single.expect("one group ran"),
        };
        if let Some(b) = bias {
            let b = dense(OP, b, dt, &[cout])?;
            let yl = Layout::contiguous(&out_shape);
            let bl = Layout::new(out_shape.to_vec(), vec![0, 1, 0], 0);
            y = y.binary_cuda(&yl, &b, &bl, BinaryOp::Add)?;
        }
        back(y, self.dtype())
    }

    /// Gradients of `conv2d` from `self` = the output gradient.
    pub(crate) fn conv2d_backward_cuda(
        &self,
        layout: &Layout,
        input: Strided<'_, Self>,
        weight: Strided<'_, Self>,
        g: &Conv2dGeometry,
        mask: GradMask,
    ) -> Result<Grads3<Self>> {
        const OP: &str = "conv2d_backward";
        let dt = compute_dtype(OP, self.dtype())?;
        let d = dims(g);
        let (n, cout) = (g.batch, g.out_channels);
        let go = dense(OP, (self, layout), dt, &g.output_shape())?;
        let mut grads: Grads3<Self> = [None, None, None];
        if mask[0] {
            let w = dense(OP, weight, dt, &g.weight_shape())?;
            let (_, dcols) = CudaStorage::output(self.ordinal(), n * d.rows * d.l, dt)?;
            let mut dcols = dcols;
            for gi in 0..d.groups {
                // W_gᵀ [K, C_out/g] (column-major in place), broadcast over the batch
                let wt = Layout::new(vec![n, d.k, d.cout_g], vec![0, 1, d.k], gi * d.cout_g * d.k);
                let gl = Layout::new(
                    vec![n, d.cout_g, d.l],
                    vec![cout * d.l, d.l, 1],
                    gi * d.cout_g * d.l,
                );
                let block = w.matmul_cuda(&wt, &go, &gl)?;
                let dst = Layout::new(
                    vec![n, d.k, d.l],
                    vec![d.rows * d.l, d.l, 1],
                    gi * d.k * d.l,
                );
                block.copy_into_cuda(&Layout::contiguous(&[n, d.k, d.l]), &mut dcols, &dst)?;
            }
            let total = g.input_shape().iter().product();
            let (_, dx) = CudaStorage::output(self.ordinal(), total, dt)?;
            launch("col2im", &dcols, g, &dx, total)?;
            grads[0] = Some(back(dx, self.dtype())?);
        }
        if mask[1] {
            let x = dense(OP, input, dt, &g.input_shape())?;
            let cols = CudaStorage::im2col(&x, g)?;
            // grad as [C_out, N*L] and cols as [rows, N*L]: the batch sum runs inside the GEMM.
            let go_t =
                go.cast_cuda(&Layout::contiguous(&[n, cout, d.l]).permute(&[1, 0, 2]), dt)?;
            let cols_t = cols.cast_cuda(
                &Layout::contiguous(&[n, d.rows, d.l]).permute(&[1, 0, 2]),
                dt,
            )?;
            let nl = n * d.l;
            let (_, mut dw) = CudaStorage::output(self.ordinal(), cout * d.k, dt)?;
            for gi in 0..d.groups {
                let a = Layout::new(vec![d.cout_g, nl], vec![nl, 1], gi * d.cout_g * nl);
                let b = Layout::new(vec![nl, d.k], vec![1, nl], gi * d.k * nl);
                let block = go_t.matmul_cuda(&a, &cols_t, &b)?;
                if d.groups == 1 {
                    dw = block;
                } else {
                    let dst = Layout::new(vec![d.cout_g, d.k], vec![d.k, 1], gi * d.cout_g * d.k);
                    block.copy_into_cuda(&Layout::contiguous(&[d.cout_g, d.k]), &mut dw, &dst)?;
                }
            }
            grads[1] = Some(back(dw, self.dtype())?);
        }
        if mask[2] {
            let gl = Layout::contiguous(&[n, cout, d.l]);
            let db = go.reduce_cuda(&gl, &[0, 2], ReduceOp::Sum)?;
            grads[2] = Some(back(db, self.dtype())?);
        }
        Ok(grads)
    }
}
