//! The launchers of `norm.cu`'s kernels: their argument struct and one method per kernel
//! (see `cuda.rs` for the design and `norm.cu` for the formulas).

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::{BatchNormShape, LayerNormShape};
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, grid_for, launch_error, suffix};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::DType;

/// The dtype statistics, weight/bias and per-element math use for a tensor of `dtype`.
pub(crate) fn stat_dtype(op: &'static str, dtype: DType) -> Result<DType> {
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

/// The kernels of this op family.
pub const NORM_KERNELS: KernelSource = KernelSource {
    file: "ops/norm/norm.cu",
    source: include_str!("norm.cu"),
};

/// Every kernel family of `norm.cu` (each exists as `kiln_<kind>_<t>` for t in f32 f64 f16 bf16).
#[cfg(test)]
pub(crate) const KERNEL_KINDS: [&str; 5] = [
    "norm_stats",
    "norm_apply",
    "norm_backward_sums",
    "norm_backward_dx",
    "layer_norm_param_grads",
];

/// `kiln_<kind>_<t>`: the norm.cu kernel for tensors of `dtype`.
pub(crate) fn kernel_name(kind: &str, dtype: DType) -> Result<String> {
    stat_dtype("norm", dtype)?;
    Ok(format!("kiln_{kind}_{}", suffix(dtype)))
}

/// The problem as the kernels receive it (matches `struct NormArgs` in norm.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct NormArgs {
    n_stats: u64,
    count: u64,
    inner: u64,
    outer_stride: u64,
    total: u64,
    stat_div: u64,
    stat_mod: u64,
    param_div: u64,
    param_mod: u64,
    has_w: u64,
    has_b: u64,
    sums_weighted: u64,
    train: u64,
    eps: f64,
}

// SAFETY: plain `#[repr(C)]` 8-byte fields with the same layout as the CUDA struct.
unsafe impl DeviceRepr for NormArgs {}

impl NormArgs {
    /// Layer norm over `[rows, cols]`: statistic `r` is row `r`, weight/bias per column.
    pub(super) fn layer(s: &LayerNormShape, eps: f64) -> Self {
        let (rows, cols) = (s.rows as u64, s.cols as u64);
        NormArgs {
            n_stats: rows,
            count: cols,
            inner: cols,
            outer_stride: 0,
            total: rows * cols,
            stat_div: cols,
            stat_mod: rows,
            param_div: 1,
            param_mod: cols,
            has_w: 0,
            has_b: 0,
            sums_weighted: 1,
            train: 1,
            eps,
        }
    }

    /// Batch norm over `[N, C, S]`: statistic and weight/bias `c` is channel `c`.
    pub(super) fn batch(s: &BatchNormShape, eps: f64) -> Self {
        let (n, c, sp) = (s.batch as u64, s.channels as u64, s.spatial as u64);
        NormArgs {
            n_stats: c,
            count: n * sp,
            inner: sp,
            outer_stride: c * sp,
            total: n * c * sp,
            stat_div: sp,
            stat_mod: c,
            param_div: sp,
            param_mod: c,
            has_w: 0,
            has_b: 0,
            sums_weighted: 0,
            train: 1,
            eps,
        }
    }

    /// One block of 256 threads per statistic (grid-stride beyond 2^16).
    fn stat_config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (grid_for(self.n_stats, 1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

fn ptr(s: Option<&CudaStorage>) -> u64 {
    s.map_or(0, CudaStorage::device_ptr)
}

/// The norm kernels of one tensor `x` (its dtype picks them) and their shared arguments.
pub(super) struct Kernels<'a> {
    pub(super) x: &'a CudaStorage,
    pub(super) args: NormArgs,
    pub(super) at: DType,
}

impl Kernels<'_> {
    fn launch(
        &self,
        kind: &str,
        config: LaunchConfig,
        ptrs_before: &[u64],
        ptrs_after: &[u64],
    ) -> Result<()> {
        let name = kernel_name(kind, self.x.dtype())?;
        let stream = crate::storage::cuda_stream(self.x.ordinal())?;
        let f = function(&stream, &NORM_KERNELS, &name)?;
        let mut b = stream.launch_builder(&f);
        for p in ptrs_before {
            b.arg(p);
        }
        b.arg(&self.args);
        for p in ptrs_after {
            b.arg(p);
        }
        // SAFETY: every caller passes the pointers of norm.cu's signature for `kind`, in order:
        // contiguous tensors of `args.total` elements of the tensor dtype, statistic vectors of
        // `args.n_stats` and parameter vectors of `args.param_mod` elements of the statistics
        // dtype (null only where `has_w` / `has_b` say it is unread), outputs of those sizes.
        unsafe { b.launch(config) }.map_err(|e| launch_error(&name, e))?;
        Ok(())
    }

    fn stat_vec(&self) -> Result<CudaStorage> {
        Ok(CudaStorage::output(self.x.ordinal(), self.args.n_stats as usize, self.at)?.1)
    }

    /// `(mean, biased var, rstd)` per statistic.
    pub(super) fn stats(&self) -> Result<[CudaStorage; 3]> {
        let n = self.args.n_stats as usize;
        if self.args.count == 0 {
            let nan = |_| CudaStorage::full_cuda(self.x.ordinal(), n, f64::NAN, self.at);
            return Ok([nan(0)?, nan(1)?, nan(2)?]);
        }
        let out = [self.stat_vec()?, self.stat_vec()?, self.stat_vec()?];
        if n > 0 {
            let p: Vec<u64> = out.iter().map(CudaStorage::device_ptr).collect();
            self.launch(
                "norm_stats",
                self.args.stat_config(),
                &[self.x.device_ptr()],
                &p,
            )?;
        }
        Ok(out)
    }

    /// The normalised tensor, in the tensor's dtype.
    pub(super) fn apply(
        &self,
        [mean, rstd]: [&CudaStorage; 2],
        w: Option<&CudaStorage>,
        b: Option<&CudaStorage>,
    ) -> Result<CudaStorage> {
        let mut k = Kernels {
            args: self.args,
            ..*self
        };
        (k.args.has_w, k.args.has_b) = (u64::from(w.is_some()), u64::from(b.is_some()));
        let (_, y) =
            CudaStorage::output(self.x.ordinal(), self.args.total as usize, self.x.dtype())?;
        if self.args.total > 0 {
            let after = [
                mean.device_ptr(),
                rstd.device_ptr(),
                ptr(w),
                ptr(b),
                y.device_ptr(),
            ];
            k.launch(
                "norm_apply",
                elementwise_config(self.args.total),
                &[self.x.device_ptr()],
                &after,
            )?;
        }
        Ok(y)
    }

    /// Per statistic `(sum g, sum g * xhat)` of the output gradient `go`.
    pub(super) fn backward_sums(
        &self,
        go: &CudaStorage,
        [mean, rstd]: [&CudaStorage; 2],
        w: Option<&CudaStorage>,
    ) -> Result<[CudaStorage; 2]> {
        let n = self.args.n_stats as usize;
        if self.args.count == 0 {
            let zero = || CudaStorage::full_cuda(self.x.ordinal(), n, 0.0, self.at);
            return Ok([zero()?, zero()?]);
        }
        let mut k = Kernels {
            args: self.args,
            ..*self
        };
        k.args.has_w = u64::from(w.is_some());
        let out = [self.stat_vec()?, self.stat_vec()?];
        if n > 0 {
            let before = [go.device_ptr(), self.x.device_ptr()];
            let after = [
                mean.device_ptr(),
                rstd.device_ptr(),
                ptr(w),
                out[0].device_ptr(),
                out[1].device_ptr(),
            ];
            k.launch(
                "norm_backward_sums",
                self.args.stat_config(),
                &before,
                &after,
            )?;
        }
        Ok(out)
    }

    /// The input gradient (in the tensor's dtype); `sums` are unread when `args.train` is 0.
    pub(super) fn backward_dx(
        &self,
        go: &CudaStorage,
        [mean, rstd]: [&CudaStorage; 2],
        w: Option<&CudaStorage>,
        sums: Option<&[CudaStorage; 2]>,
    ) -> Result<CudaStorage> {
        let mut k = Kernels {
            args: self.args,
            ..*self
        };
        k.args.has_w = u64::from(w.is_some());
        k.args.train = u64::from(sums.is_some());
        let total = self.args.total;
        let (_, dx) = CudaStorage::output(self.x.ordinal(), total as usize, self.x.dtype())?;
        if total > 0 {
            let before = [go.device_ptr(), self.x.device_ptr()];
            let after = [
                mean.device_ptr(),
                rstd.device_ptr(),
                ptr(w),
                ptr(sums.map(|s| &s[0])),
                ptr(sums.map(|s| &s[1])),
                dx.device_ptr(),
            ];
            k.launch(
                "norm_backward_dx",
                elementwise_config(total),
                &before,
                &after,
            )?;
        }
        Ok(dx)
    }

    /// Layer norm's per-column `(dweight, dbias)` (statistics dtype).
    pub(super) fn layer_param_grads(
        &self,
        go: &CudaStorage,
        [mean, rstd]: [&CudaStorage; 2],
    ) -> Result<[CudaStorage; 2]> {
        let cols = self.args.param_mod;
        let vec = || CudaStorage::output(self.x.ordinal(), cols as usize, self.at);
        let (dw, db) = (vec()?.1, vec()?.1);
        if cols > 0 {
            let before = [go.device_ptr(), self.x.device_ptr()];
            let after = [
                mean.device_ptr(),
                rstd.device_ptr(),
                dw.device_ptr(),
                db.device_ptr(),
            ];
            self.launch(
                "layer_norm_param_grads",
                elementwise_config(cols),
                &before,
                &after,
            )?;
        }
        Ok([dw, db])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_and_statistics_dtypes() {
        assert_eq!(
            kernel_name("norm_stats", DType::BF16).unwrap(),
            "kiln_norm_stats_bf16"
        );
        assert_eq!(
            kernel_name("layer_norm_param_grads", DType::F16).unwrap(),
            "kiln_layer_norm_param_grads_f16"
        );
        assert_eq!(
            kernel_name("norm_backward_dx", DType::F64).unwrap(),
            "kiln_norm_backward_dx_f64"
        );
        assert!(kernel_name("norm_apply", DType::I64).is_err());
        for (t, s) in [
            (DType::F16, DType::F32),
            (DType::BF16, DType::F32),
            (DType::F32, DType::F32),
            (DType::F64, DType::F64),
        ] {
            assert_eq!(stat_dtype("norm", t).unwrap(), s);
        }
    }

    #[test]
    fn args_address_rows_and_channels() {
        // layer norm over [3, 5]: row r holds elements r*5 .. r*5+4, weights per column
        let l = NormArgs::layer(&LayerNormShape::new(&[3, 5], &[5]).unwrap(), 1e-5);
        assert_eq!((l.n_stats, l.count, l.inner, l.total), (3, 5, 5, 15));
        assert_eq!(
            (l.stat_div, l.stat_mod, l.param_div, l.param_mod),
            (5, 3, 1, 5)
        );
        // batch norm over [2, 3, 4]: channel c holds (n*3 + c)*4 + s
        let b = NormArgs::batch(&BatchNormShape::from_input_shape(&[2, 3, 4]).unwrap(), 0.0);
        assert_eq!((b.n_stats, b.count, b.inner, b.outer_stride), (3, 8, 4, 12));
        assert_eq!(
            (b.stat_div, b.stat_mod, b.param_div, b.param_mod),
            (4, 3, 4, 3)
        );
        // element j = 5 of channel 1 (n = 1, s = 1) sits at 1*12 + 1*4 + 1 = 17,
        // and flat index 17 maps back to channel (17 / 4) % 3 = 1
        let at = (5 / b.inner) * b.outer_stride + b.inner + 5 % b.inner;
        assert_eq!(at, 17);
        assert_eq!((at / b.stat_div) % b.stat_mod, 1);
    }
}
