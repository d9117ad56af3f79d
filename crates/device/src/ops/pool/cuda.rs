//! CUDA 2-D pooling (max, average, adaptive average), forward and backward: the kernels of
//! `pool.cu`, one thread per output element.
//!
//! Inputs are brought to contiguous f32/f64 first (16-bit floats widen to f32 and the result is
//! rounded back once, as on the CPU). Max pooling's backward validates its indices on the device
//! (`ops/index`'s first-bad-index check), reporting a bad one exactly as the CPU does; the
//! backward passes add into a zeroed input gradient with `atomicAdd`, since windows overlap.

use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::PoolShape;
use crate::backend::{Pool2d, Strided};
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::{BackendStorage, DType, Layout};

/// The kernels of this op family.
pub const POOL_KERNELS: KernelSource = KernelSource {
    file: "ops/pool/pool.cu",
    source: include_str!("pool.cu"),
};

/// The geometry as the kernels receive it (matches `struct PoolArgs` in pool.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct PoolArgs {
    planes: u64,
    ih: u64,
    iw: u64,
    oh: u64,
    ow: u64,
    kh: u64,
    kw: u64,
    sh: u64,
    sw: u64,
    ph: u64,
    pw: u64,
    dh: u64,
    dw: u64,
    count_include_pad: u64,
    divisor_override: u64,
}

// SAFETY: plain `#[repr(C)]` integers with the same layout as the CUDA struct.
unsafe impl DeviceRepr for PoolArgs {}

fn shape_of(pool: &Pool2d) -> &PoolShape {
    match pool {
        Pool2d::Max(g) => &g.shape,
        Pool2d::Avg(g) => &g.shape,
        Pool2d::AdaptiveAvg(g) => &g.shape,
    }
}

fn pool_args(pool: &Pool2d) -> PoolArgs {
    let s = shape_of(pool);
    let u = |v: usize| v as u64;
    let mut a = PoolArgs {
        planes: u(s.batch * s.channels),
        ih: u(s.input_size[0]),
        iw: u(s.input_size[1]),
        oh: u(s.output_size[0]),
        ow: u(s.output_size[1]),
        ..PoolArgs::default()
    };
    let set = |a: &mut PoolArgs, k: [usize; 2], st: [usize; 2], p: [usize; 2], d: [usize; 2]| {
        (a.kh, a.kw, a.sh, a.sw) = (u(k[0]), u(k[1]), u(st[0]), u(st[1]));
        (a.ph, a.pw, a.dh, a.dw) = (u(p[0]), u(p[1]), u(d[0]), u(d[1]));
    };
    match pool {
        Pool2d::Max(g) => {
            let p = g.params;
            set(&mut a, p.kernel_size, p.stride, p.padding, p.dilation);
        }
        Pool2d::Avg(g) => {
            let p = g.params;
            set(&mut a, p.kernel_size, p.stride, p.padding, [1, 1]);
            a.count_include_pad = u64::from(p.count_include_pad);
            a.divisor_override = p.divisor_override.map_or(0, u);
        }
        Pool2d::AdaptiveAvg(_) => {}
    }
    a
}

fn name(pool: &Pool2d) -> &'static str {
    match pool {
        Pool2d::Max(_) => "max_pool",
        Pool2d::Avg(_) => "avg_pool",
        Pool2d::AdaptiveAvg(_) => "adaptive_avg_pool",
    }
}

fn compute_dtype(dtype: DType) -> Result<DType> {
    match dtype {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        other => Err(Error::UnsupportedDType {
            op: "pool2d",
            dtype: other,
            hint: "this kernel runs on floating-point tensors; convert with to_dtype(DType::F32) \
                   first",
        }),
    }
}

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
                "operand shape {:?} does not match the pooling's {shape:?}",
                l.shape()
            ),
        });
    }
    s.cast_cuda(l, dt)
}

fn back(x: CudaStorage, out: DType) -> Result<CudaStorage> {
    if x.dtype() == out {
        Ok(x)
    } else {
        x.cast_cuda(&Layout::contiguous(&[x.len()]), out)
    }
}

impl CudaStorage {
    /// Pooling forward; max pooling also returns its `I64` indices.
    pub(crate) fn pool2d_cuda(
        &self,
        layout: &Layout,
        pool: &Pool2d,
    ) -> Result<(Self, Option<Self>)> {
        const OP: &str = "pool2d";
        let dt = compute_dtype(self.dtype())?;
        let s = shape_of(pool);
        let x = dense(OP, (self, layout), dt, &s.input_shape())?;
        let total = s.output_shape().iter().product::<usize>();
        let (stream, out) = CudaStorage::output(self.ordinal(), total, dt)?;
        let indices = match pool {
            Pool2d::Max(_) => Some(CudaStorage::output(self.ordinal(), total, DType::I64)?.1),
            _ => None,
        };
        if total > 0 {
            let suffix = if dt == DType::F64 { "f64" } else { "f32" };
            let kernel = format!("kiln_{}_{suffix}", name(pool));
            let f = function(&stream, &POOL_KERNELS, &kernel)?;
            let (a, xp, op, n) = (
                pool_args(pool),
                x.device_ptr(),
                out.device_ptr(),
                total as u64,
            );
            let ip = indices.as_ref().map_or(0, |i| i.device_ptr());
            let mut b = stream.launch_builder(&f);
            b.arg(&xp).arg(&a).arg(&op);
            if indices.is_some() {
                b.arg(&ip);
            }
            b.arg(&n);
            // SAFETY: signatures as in pool.cu; `x` is the contiguous input of the geometry
            // (whose constructor guarantees non-empty max windows), `out`/`indices` hold
            // `total` output elements.
            unsafe { b.launch(elementwise_config(n)) }.map_err(|e| launch_error(&kernel, e))?;
        }
        Ok((back(out, self.dtype())?, indices))
    }

    /// Pooling backward from `self` = the output gradient (`indices` for max pooling).
    pub(crate) fn pool2d_backward_cuda(
        &self,
        layout: &Layout,
        indices: Option<Strided<'_, Self>>,
        pool: &Pool2d,
    ) -> Result<Self> {
        const OP: &str = "pool2d_backward";
        let dt = compute_dtype(self.dtype())?;
        let s = shape_of(pool);
        let go = dense(OP, (self, layout), dt, &s.output_shape())?;
        let in_total = s.input_shape().iter().product::<usize>();
        let out_total = s.output_shape().iter().product::<usize>();
        let idx = match (pool, indices) {
            (Pool2d::Max(_), None) => {
                return Err(Error::LengthMismatch {
                    op: "max_pool2d_backward",
                    what: "got no indices buffer, but max pooling's backward needs the indices \
                           its forward returned"
                        .into(),
                })
            }
            (Pool2d::Max(_), Some(i)) => {
                if i.1.shape() != s.output_shape() {
                    return Err(Error::LengthMismatch {
                        op: "max_pool2d_backward",
                        what: format!(
                            "indices of shape {:?} for an output of {:?}",
                            i.1.shape(),
                            s.output_shape()
                        ),
                    });
                }
                let plane = s.input_size[0] * s.input_size[1];
                Some(crate::ops::index::cuda::indices(
                    "max_pool2d_backward",
                    i,
                    2,
                    plane,
                )?)
            }
            _ => None,
        };
        let gin = CudaStorage::full_cuda(self.ordinal(), in_total, 0.0, dt)?;
        if out_total > 0 {
            let stream = crate::storage::cuda_stream(self.ordinal())?;
            let suffix = if dt == DType::F64 { "f64" } else { "f32" };
            let kernel = format!("kiln_{}_backward_{suffix}", name(pool));
            let f = function(&stream, &POOL_KERNELS, &kernel)?;
            let (a, gp, dp, n) = (
                pool_args(pool),
                go.device_ptr(),
                gin.device_ptr(),
                out_total as u64,
            );
            let ip = idx.as_ref().map_or(0, |i| i.ptr);
            let mut b = stream.launch_builder(&f);
            b.arg(&gp);
            if idx.is_some() {
                b.arg(&ip);
            }
            b.arg(&a).arg(&dp).arg(&n);
            // SAFETY: signatures as in pool.cu; `go` holds the output gradient, `gin` the zeroed
            // input gradient; max-pool indices were checked to lie inside the input plane.
            unsafe { b.launch(elementwise_config(n)) }.map_err(|e| launch_error(&kernel, e))?;
        }
        back(gin, self.dtype())
    }
}
