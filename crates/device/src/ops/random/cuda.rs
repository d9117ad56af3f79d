//! CUDA generators: `arange` and the Philox draws of `random.cu`, each writing a fresh buffer on
//! the device with no host round trip, and [`RandomOps`] for CUDA buffers.

use super::RandomOps;
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{elementwise_config, function, launch_error, suffix};
use crate::error::Result;
use crate::storage::{cuda_ordinal, CudaStorage};
use crate::DType;
use crate::Device;
use cudarc::driver::PushKernelArg;

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

impl RandomOps for CudaStorage {
    fn rand_uniform(
        device: Device,
        n: usize,
        low: f64,
        high: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        let generator = Generator::Uniform {
            low,
            high,
            seed,
            offset,
        };
        CudaStorage::generate_cuda(cuda_ordinal(device)?, n, dtype, generator)
    }

    fn rand_normal(
        device: Device,
        n: usize,
        mean: f64,
        std: f64,
        seed: u64,
        offset: u64,
        dtype: DType,
    ) -> Result<Self> {
        let generator = Generator::Normal {
            mean,
            std,
            seed,
            offset,
        };
        CudaStorage::generate_cuda(cuda_ordinal(device)?, n, dtype, generator)
    }
}
