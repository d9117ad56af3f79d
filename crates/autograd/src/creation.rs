//! Tensor constructors: filled (`full`, `zeros`, `ones`, their `_like` forms, `scalar`),
//! ranges (`arange`) and host data (`from_vec`, `from_slice`). Every constructor makes a leaf
//! with no history over a fresh contiguous storage, and checks its arguments before
//! allocating anything.

use crate::error::{arg_err, shape_err};
use crate::tensor::{checked_numel, fmt_shape, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::{CpuStorage, DType, Device, Element, Storage};

impl Tensor {
    /// A tensor of `shape` filled with `value`.
    pub fn full(shape: &[usize], value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let n = checked_numel("full", shape)?;
        Ok(Tensor::from_storage(
            Storage::full(device, n, value, dtype)?,
            shape,
            None,
        ))
    }

    /// Zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// Ones.
    pub fn ones(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// Zeros with this tensor's shape, dtype and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.dtype(), self.device())
    }

    /// Ones with this tensor's shape, dtype and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.dtype(), self.device())
    }

    /// A 0-d tensor holding `value`.
    pub fn scalar(value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(&[], value, dtype, device)
    }

    /// `start, start + step, ...` up to but excluding `end` (PyTorch's `arange`).
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(arg_err(
                "arange",
                format!("start {start}, end {end} and step {step} must be finite and step nonzero"),
            ));
        }
        if (end - start) * step < 0.0 {
            return Err(arg_err(
                "arange",
                format!("step {step} goes away from end: start {start} and end {end} need a step of the other sign"),
            ));
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        Ok(Tensor::from_storage(
            Storage::arange(device, start, step, n, dtype)?,
            &[n],
            None,
        ))
    }

    /// A tensor of `shape` owning `data` (its dtype is `T`'s).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        let n = checked_numel("from_vec", shape)?;
        if data.len() != n {
            return Err(shape_err(
                "from_vec",
                format!(
                    "{} elements cannot fill shape {} (needs {n})",
                    data.len(),
                    fmt_shape(shape)
                ),
            ));
        }
        let host = CpuStorage::from_vec(data);
        // On the CPU the host buffer is the storage (no second block).
        let storage = match device {
            Device::Cpu => Storage::Cpu(host),
            _ => Storage::from_cpu(device, &host)?,
        };
        Ok(Tensor::from_storage(storage, shape, None))
    }

    /// A tensor of `shape` copying `data`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: Device) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }
}
