//! The default random generator: a seed and a Philox counter offset, process-wide.
//!
//! Each draw of `n` numbers takes counters `offset .. offset + n` and advances the offset, so a
//! sequence of draws after `manual_seed(s)` is reproducible and identical on every device (the
//! numbers depend only on seed and counter, see `kiln_device::ops::random`).

use crate::tensor::{checked_numel, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{DType, Device, Storage};
use std::sync::Mutex;

/// PyTorch's default CPU seed, so an unseeded run is still deterministic.
const DEFAULT_SEED: u64 = 67_280_421_310_721;

static GENERATOR: Mutex<(u64, u64)> = Mutex::new((DEFAULT_SEED, 0));

/// Resets the default generator to `seed` (counter offset 0).
pub fn manual_seed(seed: u64) {
    *GENERATOR.lock().unwrap_or_else(|p| p.into_inner()) = (seed, 0);
}

/// Reserves `n` counters: returns `(seed, first counter)`.
fn reserve(n: usize) -> (u64, u64) {
    let mut g = GENERATOR.lock().unwrap_or_else(|p| p.into_inner());
    let out = *g;
    g.1 = g.1.wrapping_add(n as u64);
    out
}

/// An explicit generator (seed + counter offset), for reproducible draws independent of the
/// process-wide default one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

impl Generator {
    /// A generator at counter 0 of `seed`.
    pub fn new(seed: u64) -> Self {
        Generator { seed, offset: 0 }
    }

    fn reserve(&mut self, n: usize) -> (u64, u64) {
        let out = (self.seed, self.offset);
        self.offset = self.offset.wrapping_add(n as u64);
        out
    }

    /// Uniform samples in `[low, high)`.
    pub fn uniform(
        &mut self,
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let n = checked_numel("uniform", shape)?;
        let (seed, offset) = self.reserve(n);
        Ok(Tensor::from_storage(
            Storage::rand_uniform(device, n, low, high, seed, offset, dtype)?,
            shape,
            None,
        ))
    }

    /// Normal samples with `mean` and `std`.
    pub fn normal(
        &mut self,
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let n = checked_numel("uniform", shape)?;
        let (seed, offset) = self.reserve(n);
        Ok(Tensor::from_storage(
            Storage::rand_normal(device, n, mean, std, seed, offset, dtype)?,
            shape,
            None,
        ))
    }
}

impl Tensor {
    /// Uniform samples in `[0, 1)` from the default generator.
    pub fn rand(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::uniform(shape, 0.0, 1.0, dtype, device)
    }

    /// Uniform samples in `[low, high)` from the default generator.
    pub fn uniform(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let (seed, offset) = reserve(checked_numel("uniform", shape)?);
        Generator { seed, offset }.uniform(shape, low, high, dtype, device)
    }

    /// Standard normal samples from the default generator.
    pub fn randn(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::normal(shape, 0.0, 1.0, dtype, device)
    }

    /// Normal samples with `mean` and `std` from the default generator.
    pub fn normal(
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let (seed, offset) = reserve(checked_numel("normal", shape)?);
        Generator { seed, offset }.normal(shape, mean, std, dtype, device)
    }
}
