//! CUDA fused softmax-cross-entropy: launches the kernels of `loss.cu` for
//! [`CudaStorage::softmax_cross_entropy`](crate::LossOps::softmax_cross_entropy).
//!
//! The kernels run on contiguous f32/f64 buffers, so the launcher first brings each operand to
//! that form on the device (a strided or 16-bit view is gathered/converted by the copy kernels;
//! a contiguous one is used in place at its offset), as the CPU side does with `dense`. 16-bit
//! logits run in f32 and their outputs are rounded back once, as on the CPU.
//!
//! Index targets are checked on the device by a deferred check
//! (`crates/device/src/cuda/deferred/mod.rs`) queued before the loss kernel, and a bad one is
//! reported exactly as on the CPU
//! ([`KernelError::IndexOutOfRange`](crate::ops::KernelError::IndexOutOfRange) with its value
//! and position, inside [`Error::DeferredCheck`]) at the calling thread's next synchronisation,
//! instead of a device-side assert; the kernel gives such a row a NaN loss and NaN gradient and
//! reads nothing through the bad target. The mean's denominator is returned as a one-element
//! device buffer, so the op never waits.

use super::LossOps;
use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{check_spec, CrossEntropyOutput, CrossEntropySpec, TargetKind};
use crate::cuda::deferred::{self, IndexCheck};
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{function, launch_error};
use crate::error::{Error, Result};
use crate::ops::copy::CopyOps;
use crate::storage::CudaStorage;
use crate::{DType, Layout};

/// The kernels of this op family.
pub const LOSS_KERNELS: KernelSource = KernelSource {
    file: "ops/loss/loss.cu",
    source: include_str!("loss.cu"),
};

const BLOCK: u32 = 256;
const MAX_GRID: u64 = 65_536;

fn grid(n: u64) -> u32 {
    n.clamp(1, MAX_GRID) as u32
}

/// A contiguous `dtype` buffer of the view: `(buffer kept alive, device address of element 0)`.
fn dense(src: &CudaStorage, layout: &Layout, dtype: DType) -> Result<(Option<CudaStorage>, u64)> {
    src.check_view("cross_entropy", layout)?;
    if src.dtype() == dtype && layout.is_contiguous() {
        let at = src.device_ptr() + (layout.offset() * dtype.size_in_bytes()) as u64;
        return Ok((None, at));
    }
    let copy = src.to_dtype(layout, dtype)?;
    let at = copy.device_ptr();
    Ok((Some(copy), at))
}

impl LossOps for CudaStorage {
    /// Fused softmax + cross-entropy over the `[N, C, D]` view `layout` of `self`.
    fn softmax_cross_entropy(
        &self,
        layout: &Layout,
        target: &Self,
        target_layout: &Layout,
        weight: Option<(&Self, &Layout)>,
        spec: &CrossEntropySpec,
    ) -> Result<CrossEntropyOutput<Self>> {
        check_spec(spec)?;
        self.same_device("cross_entropy", target)?;
        let out_dtype = self.dtype();
        let (dtype, suffix) = match out_dtype {
            DType::F64 => (DType::F64, "f64"),
            DType::F32 | DType::F16 | DType::BF16 => (DType::F32, "f32"),
            other => {
                return Err(Error::UnsupportedDType {
                    op: "cross_entropy",
                    dtype: other,
                    hint: "logits must be floating point; convert with to_dtype(DType::F32)",
                })
            }
        };
        let shape = spec.shape;
        let mismatch = |what: String| Error::LengthMismatch {
            op: "cross_entropy",
            what,
        };
        if layout.numel() != shape.logits() {
            return Err(mismatch(format!(
                "logits hold {} elements, [N, C, D] = {:?} needs {}",
                layout.numel(),
                [shape.batch, shape.classes, shape.inner],
                shape.logits()
            )));
        }
        let p = shape.positions();
        let want_targets = match spec.target {
            TargetKind::Indices => p,
            TargetKind::Probabilities => shape.logits(),
        };
        if target_layout.numel() != want_targets {
            return Err(mismatch(format!(
                "targets hold {} values, {want_targets} expected",
                target_layout.numel()
            )));
        }
        let (_logits_keep, logits) = dense(self, layout, dtype)?;
        let (_weight_keep, weight) = match weight {
            Some((w, wl)) => {
                self.same_device("cross_entropy", w)?;
                if wl.numel() != shape.classes {
                    return Err(mismatch(format!(
                        "weight holds {} values for {} classes",
                        wl.numel(),
                        shape.classes
                    )));
                }
                dense(w, wl, dtype)?
            }
            None => {
                let ones = CudaStorage::full_cuda(self.ordinal(), shape.classes, 1.0, dtype)?;
                let at = ones.device_ptr();
                (Some(ones), at)
            }
        };
        let ordinal = self.ordinal();
        let (stream, losses) = CudaStorage::output(ordinal, p, dtype)?;
        // Without a gradient the kernel still takes a pointer: one unused element.
        let grad_len = if spec.with_grad { shape.logits() } else { 1 };
        let (_, grad) = CudaStorage::output(ordinal, grad_len, dtype)?;
        // The mean's denominator: the index kernel adds the weights of the kept targets into it;
        // for probability targets it is the count of positions.
        let start = match spec.target {
            TargetKind::Indices => 0.0,
            TargetKind::Probabilities => p as f64,
        };
        let weight_sum = CudaStorage::full_cuda(ordinal, 1, start, DType::F64)?;
        let (n, c, d) = (shape.batch as u64, shape.classes as u64, shape.inner as u64);
        let with_grad = i32::from(spec.with_grad);
        let eps = spec.label_smoothing;
        let config = LaunchConfig {
            grid_dim: (grid(p as u64), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (losses_ptr, grad_ptr, sum_ptr) = (
            losses.device_ptr(),
            grad.device_ptr(),
            weight_sum.device_ptr(),
        );
        if p > 0 {
            match spec.target {
                TargetKind::Indices => {
                    if !matches!(target.dtype(), DType::I64 | DType::U8) {
                        return Err(Error::UnsupportedDType {
                            op: "cross_entropy",
                            dtype: target.dtype(),
                            hint: "class-index targets must be integers; convert with \
                                   to_dtype(DType::I64)",
                        });
                    }
                    let (_targets_keep, targets) = dense(target, target_layout, DType::I64)?;
                    let check = IndexCheck {
                        op: "cross_entropy",
                        indices: targets,
                        shape: &[shape.batch, shape.inner],
                        dim: 1,
                        size: shape.classes,
                        ignore: Some(spec.ignore_index),
                    };
                    // Queued, not waited for (unless eager checks are on).
                    let _pending = deferred::check_indices(ordinal, check)?;
                    let name = format!("kiln_xent_index_{suffix}");
                    let f = function(&stream, &LOSS_KERNELS, &name)?;
                    let mut launch = stream.launch_builder(&f);
                    launch
                        .arg(&logits)
                        .arg(&targets)
                        .arg(&weight)
                        .arg(&n)
                        .arg(&c)
                        .arg(&d)
                        .arg(&spec.ignore_index)
                        .arg(&eps)
                        .arg(&with_grad)
                        .arg(&losses_ptr)
                        .arg(&grad_ptr)
                        .arg(&sum_ptr);
                    // SAFETY: the signature matches loss.cu; every buffer is contiguous with the
                    // length checked above (logits and grad N·C·D, targets and losses N·D,
                    // weight C), and the kernel reads no logit or weight through a bad target.
                    unsafe { launch.launch(config) }.map_err(|e| launch_error(&name, e))?;
                }
                TargetKind::Probabilities => {
                    let (_targets_keep, targets) = dense(target, target_layout, dtype)?;
                    let name = format!("kiln_xent_prob_{suffix}");
                    let f = function(&stream, &LOSS_KERNELS, &name)?;
                    let mut launch = stream.launch_builder(&f);
                    launch
                        .arg(&logits)
                        .arg(&targets)
                        .arg(&weight)
                        .arg(&n)
                        .arg(&c)
                        .arg(&d)
                        .arg(&eps)
                        .arg(&with_grad)
                        .arg(&losses_ptr)
                        .arg(&grad_ptr);
                    // SAFETY: as above, with [N, C, D] targets.
                    unsafe { launch.launch(config) }.map_err(|e| launch_error(&name, e))?;
                }
            }
        }
        let back = |s: CudaStorage| -> Result<CudaStorage> {
            if out_dtype == dtype {
                Ok(s)
            } else {
                s.to_dtype(&Layout::contiguous(&[s.len()]), out_dtype)
            }
        };
        Ok(CrossEntropyOutput {
            losses: back(losses)?,
            grad: if spec.with_grad {
                Some(back(grad)?)
            } else {
                None
            },
            total_weight: weight_sum,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::loss::CrossEntropyShape;
    use crate::prelude::*;
    use crate::testing::{close, cuda_device_or_skip, tolerance};
    use crate::CpuStorage;

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

    fn assert_close(what: &str, got: &CudaStorage, want: &CpuStorage) {
        let got = got.to_host().unwrap().to_f64_vec();
        let want = want.to_f64_vec();
        assert_eq!(got.len(), want.len(), "{what}");
        let tol = tolerance(DType::F64);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(close(*a, *b, tol), "{what}[{i}]: {a} vs {b}");
        }
    }

    #[test]
    fn cuda_matches_cpu_and_reports_the_same_bad_target() {
        let Some(dev) = cuda_device_or_skip() else {
            return;
        };
        let s = spec(TargetKind::Indices, 0.1);
        let n = s.shape.logits();
        // Magnitudes up to 1e4: the shifted log-sum-exp must hold on both sides.
        let logits: Vec<f64> = (0..n)
            .map(|i| ((i * 37) % 101) as f64 * 200.0 - 1e4)
            .collect();
        let weight: Vec<f64> = (0..300).map(|k| 0.5 + (k % 7) as f64 * 0.25).collect();
        let labels = vec![5i64, 299, -100, 0, 17, 150];
        let lc = CpuStorage::from_vec(logits);
        let (wc, tc) = (CpuStorage::from_vec(weight), CpuStorage::from_vec(labels));
        let lg = CudaStorage::from_cpu(dev, &lc).unwrap();
        let (wg, tg) = (
            CudaStorage::from_cpu(dev, &wc).unwrap(),
            CudaStorage::from_cpu(dev, &tc).unwrap(),
        );
        let ll = Layout::contiguous(&[3, 300, 2]);
        let (tl, wl) = (Layout::contiguous(&[3, 2]), Layout::contiguous(&[300]));
        let want = lc
            .softmax_cross_entropy(&ll, &tc, &tl, Some((&wc, &wl)), &s)
            .unwrap();
        let got = lg
            .softmax_cross_entropy(&ll, &tg, &tl, Some((&wg, &wl)), &s)
            .unwrap();
        assert_close("losses", &got.losses, &want.losses);
        assert_close("grad", &got.grad.unwrap(), &want.grad.unwrap());
        let total = |s: &CudaStorage| s.to_host().unwrap().to_f64_vec()[0];
        assert!(close(
            total(&got.total_weight),
            want.total_weight.to_f64_vec()[0],
            tolerance(DType::F64)
        ));

        // Probability targets through a transposed (non-contiguous) view of the logits.
        let sp = spec(TargetKind::Probabilities, 0.2);
        let probs: Vec<f64> = (0..n).map(|i| ((i * 13) % 17) as f64 / 170.0).collect();
        let pc = CpuStorage::from_vec(probs);
        let pg = CudaStorage::from_cpu(dev, &pc).unwrap();
        let lt = Layout::contiguous(&[3, 2, 300]).transpose(1, 2);
        let want = lc.softmax_cross_entropy(&lt, &pc, &ll, None, &sp).unwrap();
        let got = lg.softmax_cross_entropy(&lt, &pg, &ll, None, &sp).unwrap();
        assert_close("prob losses", &got.losses, &want.losses);
        assert_close("prob grad", &got.grad.unwrap(), &want.grad.unwrap());
        assert_eq!(
            got.total_weight.to_host().unwrap().to_f64_vec(),
            want.total_weight.to_f64_vec()
        );

        // f32 logits in bf16: outputs come back in bf16 like the CPU's.
        let lb = lc.to_dtype(&ll, DType::BF16).unwrap();
        let lbg = CudaStorage::from_cpu(dev, &lb).unwrap();
        let want = lb.softmax_cross_entropy(&ll, &tc, &tl, None, &s).unwrap();
        let got = lbg.softmax_cross_entropy(&ll, &tg, &tl, None, &s).unwrap();
        assert_eq!(got.losses.dtype(), DType::BF16);
        let (g, w) = (got.losses.to_host().unwrap(), want.losses);
        for (a, b) in g.to_f64_vec().iter().zip(w.to_f64_vec()) {
            assert!(close(*a, b, tolerance(DType::BF16)), "bf16 loss {a} vs {b}");
        }

        let bad = CpuStorage::from_vec(vec![0i64, 300, 1, -7, 2, 3]);
        let cpu_err = lc
            .softmax_cross_entropy(&ll, &bad, &tl, None, &s)
            .unwrap_err();
        let bad_g = CudaStorage::from_cpu(dev, &bad).unwrap();
        // The CUDA index check is deferred (it must not wait): the op returns, and the next
        // synchronisation reports the CPU's error (at the op itself under eager checks).
        let got = lg
            .softmax_cross_entropy(&ll, &bad_g, &tl, None, &s)
            .and_then(|_| crate::synchronize(dev));
        match (cpu_err, got) {
            (Error::Kernel(want), Err(got)) => assert_eq!(got.kernel_error(), Some(&want), "{got}"),
            (want, got) => panic!("expected the CPU's error {want:?}, got {got:?}"),
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
            "kiln_xent_index_f32",
            "kiln_xent_index_f64",
            "kiln_xent_prob_f32",
            "kiln_xent_prob_f64",
        ] {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
        }
    }
}
