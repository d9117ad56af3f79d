//! CUDA 2-D pooling (max, average, adaptive average), forward and backward: the kernels of
//! `pool.cu`, one thread per output element.
//!
//! Every dtype runs in its own kernel: f16/bf16 values are read as they are, summed in f32
//! registers and each output rounded once (the CPU widens to f32 and rounds each result once,
//! so forward results agree up to f32 summation order; max pooling is exact). Contiguous inputs
//! are read in place, other views copied contiguous first. Max pooling's backward validates its
//! indices on the device (`ops/index`'s first-bad-index check), reporting a bad one exactly as
//! the CPU does. The f32/f64 backward passes run one thread per output gradient and add into a
//! zeroed input gradient with `atomicAdd`, since windows overlap; the f16/bf16 ones run one
//! thread per input element that gathers its windows' shares in f32 and rounds once (16-bit
//! atomics would round at every addition), see `backward_gathers`.

use super::PoolOps;
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::Pool2d;
use super::PoolShape;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error, suffix};
use crate::error::{Error, Result};
use crate::ops::conv::cuda::Dense;
use crate::seam::Strided;
use crate::storage::CudaStorage;
use crate::{DType, Layout};

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
        Pool2d::Max(g) | Pool2d::MaxValues(g) => &g.shape,
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
        Pool2d::Max(g) | Pool2d::MaxValues(g) => {
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
        Pool2d::Max(_) | Pool2d::MaxValues(_) => "max_pool",
        Pool2d::Avg(_) => "avg_pool",
        Pool2d::AdaptiveAvg(_) => "adaptive_avg_pool",
    }
}

/// `kiln_<pool>[_backward]_<t>`: the pool.cu kernel for `pool` on `dtype`'s elements.
pub(crate) fn kernel_name(pool: &Pool2d, backward: bool, dtype: DType) -> Result<String> {
    check_dtype(dtype)?;
    let pass = if backward { "_backward" } else { "" };
    Ok(format!("kiln_{}{pass}_{}", name(pool), suffix(dtype)))
}

/// True when `dtype`'s backward kernels gather per input element (one thread per input
/// gradient, no zero fill) rather than scatter per output with `atomicAdd`.
pub(crate) fn backward_gathers(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// Pooling runs on the four float dtypes, each in its own precision.
fn check_dtype(dtype: DType) -> Result<DType> {
    match dtype {
        DType::F64 | DType::F32 | DType::F16 | DType::BF16 => Ok(dtype),
        other => Err(Error::UnsupportedDType {
            op: "pool2d",
            dtype: other,
            hint: "this kernel runs on floating-point tensors; convert with to_dtype(DType::F32) \
                   first",
        }),
    }
}

fn dense<'a>(
    op: &'static str,
    (s, l): Strided<'a, CudaStorage>,
    shape: &[usize],
) -> Result<Dense<'a>> {
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
    Dense::of(s, l)
}

/// One pooling of each kind (max, average, adaptive average), for the kernel-name tests.
#[cfg(test)]
pub(crate) fn every_kind_for_tests() -> [Pool2d; 3] {
    use super::{
        AdaptiveAvgPool2dGeometry, AvgPool2dGeometry, AvgPool2dParams, MaxPool2dGeometry,
        MaxPool2dParams,
    };
    let xs = [1, 1, 4, 4];
    [
        Pool2d::Max(MaxPool2dGeometry::new(xs, MaxPool2dParams::new([2, 2])).unwrap()),
        Pool2d::Avg(AvgPool2dGeometry::new(xs, AvgPool2dParams::new([2, 2])).unwrap()),
        Pool2d::AdaptiveAvg(AdaptiveAvgPool2dGeometry::new(xs, [2, 2]).unwrap()),
    ]
}

impl PoolOps for CudaStorage {
    /// Pooling forward; max pooling also returns its `I64` indices.
    fn pool2d(&self, layout: &Layout, pool: &Pool2d) -> Result<(Self, Option<Self>)> {
        const OP: &str = "pool2d";
        if let Pool2d::MaxValues(g) = pool {
            // pool.cu's max kernel writes its indices; they are dropped here.
            return Ok((self.pool2d(layout, &Pool2d::Max(*g))?.0, None));
        }
        let dt = check_dtype(self.dtype())?;
        let s = shape_of(pool);
        let x = dense(OP, (self, layout), &s.input_shape())?;
        let total = crate::checked_shape_numel(OP, &s.output_shape())?;
        let (stream, out) = CudaStorage::output(self.ordinal(), total, dt)?;
        let indices = match pool {
            Pool2d::Max(_) => Some(CudaStorage::output(self.ordinal(), total, DType::I64)?.1),
            _ => None,
        };
        if total > 0 {
            let kernel = kernel_name(pool, false, dt)?;
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
        Ok((out, indices))
    }
    /// Pooling backward from `self` = the output gradient (`indices` for max pooling).
    fn pool2d_backward(
        &self,
        layout: &Layout,
        indices: Option<Strided<'_, Self>>,
        pool: &Pool2d,
    ) -> Result<Self> {
        const OP: &str = "pool2d_backward";
        if let Pool2d::MaxValues(_) = pool {
            return Err(super::no_values_backward());
        }
        let dt = check_dtype(self.dtype())?;
        let s = shape_of(pool);
        let go = dense(OP, (self, layout), &s.output_shape())?;
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
        let gathers = backward_gathers(dt) && out_total > 0;
        // gathering writes every input element; scattering adds into zeros
        let gin = if gathers {
            CudaStorage::output(self.ordinal(), in_total, dt)?.1
        } else {
            CudaStorage::full_cuda(self.ordinal(), in_total, 0.0, dt)?
        };
        let threads = if gathers { in_total } else { out_total };
        if out_total > 0 && in_total > 0 {
            let stream = crate::storage::cuda_stream(self.ordinal())?;
            let kernel = kernel_name(pool, true, dt)?;
            let f = function(&stream, &POOL_KERNELS, &kernel)?;
            let (a, gp, dp, n) = (
                pool_args(pool),
                go.device_ptr(),
                gin.device_ptr(),
                threads as u64,
            );
            let ip = idx.as_ref().map_or(0, |i| i.ptr);
            let mut b = stream.launch_builder(&f);
            b.arg(&gp);
            if idx.is_some() {
                b.arg(&ip);
            }
            b.arg(&a).arg(&dp).arg(&n);
            // SAFETY: signatures as in pool.cu; `go` holds the output gradient, `gin` the input
            // gradient (zeroed when scattering), `n` counts outputs when scattering and inputs
            // when gathering; max-pool indices were checked to lie inside the input plane.
            unsafe { b.launch(elementwise_config(n)) }.map_err(|e| launch_error(&kernel, e))?;
        }
        Ok(gin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_follow_kind_pass_and_dtype() {
        let [max, avg, adaptive] = every_kind_for_tests();
        assert_eq!(
            kernel_name(&max, false, DType::BF16).unwrap(),
            "kiln_max_pool_bf16"
        );
        assert_eq!(
            kernel_name(&avg, true, DType::F16).unwrap(),
            "kiln_avg_pool_backward_f16"
        );
        assert_eq!(
            kernel_name(&adaptive, true, DType::F32).unwrap(),
            "kiln_adaptive_avg_pool_backward_f32"
        );
        assert_eq!(
            kernel_name(&adaptive, false, DType::F64).unwrap(),
            "kiln_adaptive_avg_pool_f64"
        );
        assert!(matches!(
            kernel_name(&max, false, DType::I64),
            Err(Error::UnsupportedDType { .. })
        ));
    }

    #[test]
    fn only_16_bit_backward_passes_gather() {
        assert!(backward_gathers(DType::F16) && backward_gathers(DType::BF16));
        assert!(!backward_gathers(DType::F32) && !backward_gathers(DType::F64));
    }
}
