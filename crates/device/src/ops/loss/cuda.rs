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
    let mut losses = stream.alloc_zeros::<T>(p).map_err(copy_err)?;
    // Without a gradient the kernel still takes a pointer: one unused element.
    let mut grad = stream
        .alloc_zeros::<T>(if spec.with_grad { shape.logits() } else { 1 })
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
    use crate::ops::loss::cpu::{self as cpu_kernel, Targets};
    use crate::ops::loss::{CrossEntropyShape, TargetKind};
    use crate::testing::cuda_device_or_skip;

    fn spec(target: TargetKind, label_smoothing: f64) -> CrossEntropySpec {
        CrossEntropySpec {
            shape: CrossEntropyShape {
                batch: 3,
                classes: 300, // more classes than threads in a block
                inner: 2,
            },
            target,
            ignore_index: -100,
            label_smoothing,
            with_grad: true,
        }
    }

    fn close(what: &str, got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-12 + 1e-12 * b.abs(),
                "{what}[{i}]: {a} vs {b}"
            );
        }
    }

    #[test]
    fn cuda_matches_cpu_and_reports_the_same_bad_target() {
        let Some(dev) = cuda_device_or_skip() else {
            return;
        };
        let stream = crate::cuda::default_stream(dev).unwrap();
        let s = spec(TargetKind::Indices, 0.1);
        let n = s.shape.logits();
        // Magnitudes up to 1e4: the shifted log-sum-exp must hold on both sides.
        let logits: Vec<f64> = (0..n)
            .map(|i| ((i * 37) % 101) as f64 * 200.0 - 1e4)
            .collect();
        let weight: Vec<f64> = (0..300).map(|k| 0.5 + (k % 7) as f64 * 0.25).collect();
        let labels = vec![5i64, 299, -100, 0, 17, 150];
        let (mut losses, mut grad) = (vec![0.0; 6], vec![0.0; n]);
        let total = cpu_kernel::softmax_cross_entropy(
            &s,
            &logits,
            Targets::Indices(&labels),
            Some(&weight),
            &mut losses,
            Some(&mut grad),
        )
        .unwrap();
        let (dl, dt, dw) = (
            stream.clone_htod(&logits).unwrap(),
            stream.clone_htod(&labels).unwrap(),
            stream.clone_htod(&weight).unwrap(),
        );
        let (gl, gg, gt) =
            softmax_cross_entropy(&stream, &s, &dl, DeviceTargets::Indices(&dt), Some(&dw))
                .unwrap();
        close("losses", &stream.clone_dtoh(&gl).unwrap(), &losses);
        close("grad", &stream.clone_dtoh(&gg.unwrap()).unwrap(), &grad);
        close("total", &[gt], &[total]);

        let sp = spec(TargetKind::Probabilities, 0.2);
        let probs: Vec<f64> = (0..n).map(|i| ((i * 13) % 17) as f64 / 170.0).collect();
        let total = cpu_kernel::softmax_cross_entropy(
            &sp,
            &logits,
            Targets::Probabilities(&probs),
            None,
            &mut losses,
            Some(&mut grad),
        )
        .unwrap();
        let dp = stream.clone_htod(&probs).unwrap();
        let (gl, gg, gt) =
            softmax_cross_entropy(&stream, &sp, &dl, DeviceTargets::Probabilities(&dp), None)
                .unwrap();
        close("prob losses", &stream.clone_dtoh(&gl).unwrap(), &losses);
        close(
            "prob grad",
            &stream.clone_dtoh(&gg.unwrap()).unwrap(),
            &grad,
        );
        close("prob total", &[gt], &[total]);

        let bad = vec![0i64, 300, 1, -7, 2, 3];
        let cpu_err = cpu_kernel::softmax_cross_entropy(
            &s,
            &logits,
            Targets::Indices(&bad),
            None,
            &mut losses,
            None,
        )
        .unwrap_err();
        let db = stream.clone_htod(&bad).unwrap();
        match softmax_cross_entropy(&stream, &s, &dl, DeviceTargets::Indices(&db), None) {
            Err(Error::Kernel(e)) => assert_eq!(e, cpu_err),
            other => panic!("expected the CPU's error {cpu_err:?}, got {other:?}"),
        }
    }

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
