//! CUDA fused softmax-cross-entropy: launches the kernels of `loss.cu` on typed device buffers.
//!
//! Index targets are checked on the device first (`kiln_xent_check_targets`), and a bad one is
//! reported exactly as on the CPU ([`KernelError::IndexOutOfRange`] with its value and position),
//! instead of a device-side assert. The launcher is not yet called by `CudaStorage` (whose
//! kernels are filled in by the CUDA backend issue); it takes `CudaSlice`s directly.

use cudarc::driver::{
    CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use std::sync::Arc;

use super::{check_spec, CrossEntropySpec};
use crate::cuda::driver_error;
use crate::cuda::kernels::{load_function, KernelSource};
use crate::error::{Error, Result};
use crate::ops::kernel_error::KernelError;

/// The kernels of this op family.
pub const LOSS_KERNELS: KernelSource = KernelSource {
    file: "ops/loss/loss.cu",
    source: include_str!("loss.cu"),
};

/// An element type the loss kernels are instantiated for.
pub trait LossElement: DeviceRepr + ValidAsZeroBits + Copy + Unpin {
    /// Suffix of the kernels' `extern "C"` names.
    const SUFFIX: &'static str;
    /// The value 1.
    const ONE: Self;
}

impl LossElement for f32 {
    const SUFFIX: &'static str = "f32";
    const ONE: Self = 1.0;
}

impl LossElement for f64 {
    const SUFFIX: &'static str = "f64";
    const ONE: Self = 1.0;
}

/// The targets of one call, on the device.
pub enum DeviceTargets<'a, T> {
    /// `[N, D]` class indices.
    Indices(&'a CudaSlice<i64>),
    /// `[N, C, D]` class probabilities.
    Probabilities(&'a CudaSlice<T>),
}

/// Per-position losses `[N, D]`, the optional gradient `[N, C, D]`, and the mean's denominator.
pub type DeviceOutput<T> = (CudaSlice<T>, Option<CudaSlice<T>>, f64);

const BLOCK: u32 = 256;
const MAX_GRID: u64 = 65_536;

fn grid(n: u64) -> u32 {
    n.clamp(1, MAX_GRID) as u32
}

fn launch_err(e: cudarc::driver::DriverError) -> Error {
    driver_error("cuLaunchKernel", e)
}

fn copy_err(e: cudarc::driver::DriverError) -> Error {
    driver_error("cuMemcpy", e)
}

/// Checks `targets` on the device; returns the first bad one as the CPU check would.
fn check_targets(
    stream: &Arc<CudaStream>,
    spec: &CrossEntropySpec,
    targets: &CudaSlice<i64>,
) -> Result<()> {
    let p = spec.shape.positions() as u64;
    let mut first_bad = stream.clone_htod(&[p]).map_err(copy_err)?;
    let function = load_function(stream.context(), &LOSS_KERNELS, "kiln_xent_check_targets")?;
    let (c, ignore) = (spec.shape.classes as u64, spec.ignore_index);
    let mut launch = stream.launch_builder(&function);
    launch
        .arg(targets)
        .arg(&p)
        .arg(&c)
        .arg(&ignore)
        .arg(&mut first_bad);
    let config = LaunchConfig {
        grid_dim: (grid(p.div_ceil(u64::from(BLOCK))), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: signature (const i64*, u64, u64, i64, u64*) as in loss.cu; reads targets[0..p).
    unsafe { launch.launch(config) }.map_err(launch_err)?;
    let flat = stream.clone_dtoh(&first_bad).map_err(copy_err)?[0];
    if flat >= p {
        return Ok(());
    }
    let value = stream
        .clone_dtoh(&targets.slice(flat as usize..flat as usize + 1))
        .map_err(copy_err)?[0];
    let inner = spec.shape.inner.max(1) as u64;
    Err(KernelError::IndexOutOfRange {
        op: "cross_entropy",
        index: value,
        position: vec![(flat / inner) as usize, (flat % inner) as usize],
        dim: 1,
        size: spec.shape.classes,
    }
    .into())
}

/// Fused softmax-cross-entropy on contiguous `[N, C, D]` device `logits`, on `stream`.
pub fn softmax_cross_entropy<T: LossElement>(
    stream: &Arc<CudaStream>,
    spec: &CrossEntropySpec,
    logits: &CudaSlice<T>,
    targets: DeviceTargets<'_, T>,
    weight: Option<&CudaSlice<T>>,
) -> Result<DeviceOutput<T>> {
    check_spec(spec)?;
    let shape = spec.shape;
    let mismatch = |what: String| Error::LengthMismatch {
        op: "cross_entropy",
        what,
    };
    if logits.len() != shape.logits() {
        return Err(mismatch(format!(
            "logits hold {} elements, [N, C, D] = {:?} needs {}",
            logits.len(),
            [shape.batch, shape.classes, shape.inner],
            shape.logits()
        )));
    }
    let ones;
    let weight = match weight {
        Some(w) if w.len() == shape.classes => w,
        Some(w) => {
            return Err(mismatch(format!(
                "weight holds {} values for {} classes",
                w.len(),
                shape.classes
            )))
        }
        None => {
            ones = stream
                .clone_htod(&vec![T::ONE; shape.classes])
                .map_err(copy_err)?;
            &ones
        }
    };
    let p = shape.positions();
    let mut losses = stream.alloc_zeros::<T>(p.max(1)).map_err(copy_err)?;
    let mut grad = stream
        .alloc_zeros::<T>(if spec.with_grad {
            shape.logits().max(1)
        } else {
            1
        })
        .map_err(copy_err)?;
    let mut weight_sum = stream.alloc_zeros::<f64>(1).map_err(copy_err)?;
    let (n, c, d) = (shape.batch as u64, shape.classes as u64, shape.inner as u64);
    let with_grad = i32::from(spec.with_grad);
    let eps = spec.label_smoothing;
    let config = LaunchConfig {
        grid_dim: (grid(p as u64), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let is_index = matches!(targets, DeviceTargets::Indices(_));
    if p > 0 {
        match targets {
            DeviceTargets::Indices(t) => {
                if t.len() != p {
                    return Err(mismatch(format!(
                        "targets hold {} values for {p} positions",
                        t.len()
                    )));
                }
                check_targets(stream, spec, t)?;
                let name = format!("kiln_xent_index_{}", T::SUFFIX);
                let function = load_function(stream.context(), &LOSS_KERNELS, &name)?;
                let mut launch = stream.launch_builder(&function);
                launch
                    .arg(logits)
                    .arg(t)
                    .arg(weight)
                    .arg(&n)
                    .arg(&c)
                    .arg(&d)
                    .arg(&spec.ignore_index)
                    .arg(&eps)
                    .arg(&with_grad)
                    .arg(&mut losses)
                    .arg(&mut grad)
                    .arg(&mut weight_sum);
                // SAFETY: the signature matches loss.cu; lengths were checked above (logits and
                // grad N·C·D, targets and losses N·D, weight C) and every target is valid.
                unsafe { launch.launch(config) }.map_err(launch_err)?;
            }
            DeviceTargets::Probabilities(t) => {
                if t.len() != shape.logits() {
                    return Err(mismatch(format!(
                        "targets hold {} values, the logits {}",
                        t.len(),
                        shape.logits()
                    )));
                }
                let name = format!("kiln_xent_prob_{}", T::SUFFIX);
                let function = load_function(stream.context(), &LOSS_KERNELS, &name)?;
                let mut launch = stream.launch_builder(&function);
                launch
                    .arg(logits)
                    .arg(t)
                    .arg(weight)
                    .arg(&n)
                    .arg(&c)
                    .arg(&d)
                    .arg(&eps)
                    .arg(&with_grad)
                    .arg(&mut losses)
                    .arg(&mut grad);
                // SAFETY: as above, with [N, C, D] targets.
                unsafe { launch.launch(config) }.map_err(launch_err)?;
            }
        }
    }
    let total = if is_index {
        stream.clone_dtoh(&weight_sum).map_err(copy_err)?[0]
    } else {
        p as f64
    };
    Ok((losses, spec.with_grad.then_some(grad), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_cu_compiles_to_ptx_with_every_kernel() {
        let ptx = match crate::cuda::kernels::compile_ptx(&LOSS_KERNELS, (8, 0)) {
            Err(Error::NvrtcNotFound) if !crate::testing::cuda_required() => {
                eprintln!(
                    "skipping loss_cu_compiles_to_ptx_with_every_kernel: libnvrtc.so not found"
                );
                return;
            }
            other => other.unwrap(),
        };
        for name in [
            "kiln_xent_check_targets",
            "kiln_xent_index_f32",
            "kiln_xent_index_f64",
            "kiln_xent_prob_f32",
            "kiln_xent_prob_f64",
        ] {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
        }
    }
}
