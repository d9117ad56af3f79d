//! CUDA generators: `full` (the fill kernel of `fill.cu`), `arange` and the Philox draws of
//! `random.cu`, each writing a fresh buffer on the device with no host round trip.

use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error, suffix};
use crate::dtype::{BoolByte, Element};
use crate::error::Result;
use crate::ops::fill::cuda::fill;
use crate::storage::CudaStorage;
use crate::DType;
use cudarc::driver::PushKernelArg;
use half::{bf16, f16};

/// The kernels of this op family.
pub const RANDOM_KERNELS: KernelSource = KernelSource {
    file: "ops/random/random.cu",
    source: include_str!("random.cu"),
};

/// What a generator kernel writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Generator {
    /// `start + step * i`.
    Arange {
        /// First value.
        start: f64,
        /// Increment.
        step: f64,
    },
    /// Uniform in `[low, high)`.
    Uniform {
        /// Lower bound.
        low: f64,
        /// Upper bound.
        high: f64,
        /// Philox key.
        seed: u64,
        /// First Philox counter.
        offset: u64,
    },
    /// Normal with `mean` and `std`.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
        /// Philox key.
        seed: u64,
        /// First Philox counter.
        offset: u64,
    },
}

impl CudaStorage {
    /// `n` elements equal to `value` converted to `dtype` (with the CPU's `from_f64`).
    pub(crate) fn full_cuda(ordinal: usize, n: usize, value: f64, dtype: DType) -> Result<Self> {
        let (stream, out) = CudaStorage::output(ordinal, n, dtype)?;
        let dst = out.device_ptr();
        // SAFETY: `out` holds n elements of `dtype` and is used on `stream`.
        unsafe {
            match dtype {
                DType::F32 => fill(&stream, dst, n, f32::from_f64(value))?,
                DType::F64 => fill(&stream, dst, n, value)?,
                DType::F16 => fill(&stream, dst, n, f16::from_f64(value))?,
                DType::BF16 => fill(&stream, dst, n, bf16::from_f64(value))?,
                DType::I64 => fill(&stream, dst, n, i64::from_f64(value))?,
                DType::U8 => fill(&stream, dst, n, u8::from_f64(value))?,
                DType::Bool => fill(&stream, dst, n, BoolByte::from_f64(value).0)?,
            }
        }
        Ok(out)
    }

    /// `n` elements of `dtype` from `generator`.
    pub(crate) fn generate_cuda(
        ordinal: usize,
        n: usize,
        dtype: DType,
        generator: Generator,
    ) -> Result<Self> {
        let (stream, out) = CudaStorage::output(ordinal, n, dtype)?;
        if n == 0 {
            return Ok(out);
        }
        let (dst, n) = (out.device_ptr(), n as u64);
        let kind = match generator {
            Generator::Arange { .. } => "arange",
            Generator::Uniform { .. } => "rand_uniform",
            Generator::Normal { .. } => "rand_normal",
        };
        let name = format!("kiln_{kind}_{}", suffix(dtype));
        let f = function(&stream, &RANDOM_KERNELS, &name)?;
        let (a, b, seed, offset) = match generator {
            Generator::Arange { start, step } => (start, step, 0, 0),
            Generator::Uniform {
                low,
                high,
                seed,
                offset,
            } => (low, high, seed, offset),
            Generator::Normal {
                mean,
                std,
                seed,
                offset,
            } => (mean, std, seed, offset),
        };
        let mut launch = stream.launch_builder(&f);
        launch.arg(&dst);
        if let Generator::Arange { .. } = generator {
            launch.arg(&a).arg(&b).arg(&n);
        } else {
            launch.arg(&n).arg(&a).arg(&b).arg(&seed).arg(&offset);
        }
        // SAFETY: signatures as in random.cu; the kernels write exactly out[0..n).
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
        Ok(out)
    }
}
