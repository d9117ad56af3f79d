//! CPU fused softmax-cross-entropy: samples in parallel (one rayon task per sample `n`, covering
//! its `D` positions), statistics in `f64` (see the module docs of [`super`] for the math).
//!
//! Plain `[N, C]` logits (`D = 1`) are swept row by row, in `cpu_row`'s vectorised passes.
//! Spatial logits (`D > 1`, e.g. `[N, C, H, W]`) store a position's classes `D` elements apart,
//! so a per-position sweep would touch one cache line per logit; there the sample's `[C, D]`
//! block is swept class-major instead, carrying the `D` positions' running statistics side by
//! side, so every read and write is contiguous.

use rayon::prelude::*;
use std::any::Any;

use super::cpu_row::{self, below, share, RowTarget};
use super::{
    check_spec, check_targets, CrossEntropyOutput, CrossEntropyShape, CrossEntropySpec, LossOps,
    TargetKind,
};
use crate::layout::Layout;
use crate::ops::copy::CopyOps;
use crate::ops::kernel_error::{check_len, KernelError};
use crate::ops::KernelFloat;
use crate::storage::{CpuStorage, HostBuffer};
use crate::{DType, Error, Result};

/// The targets of one call, as slices.
#[derive(Debug, Clone, Copy)]
pub enum Targets<'a, T> {
    /// `[N, D]` class indices.
    Indices(&'a [i64]),
    /// `[N, C, D]` class probabilities.
    Probabilities(&'a [T]),
}

/// Fused softmax-cross-entropy on contiguous `[N, C, D]` `logits`: writes the per-position
/// losses (`[N, D]`) and, when given, the per-position gradient (`[N, C, D]`); returns the
/// denominator of `reduction='mean'`.
pub fn softmax_cross_entropy<T: KernelFloat>(
    spec: &CrossEntropySpec,
    logits: &[T],
    targets: Targets<'_, T>,
    weight: Option<&[T]>,
    losses: &mut [T],
    grad: Option<&mut [T]>,
) -> Result<f64, KernelError> {
    const OP: &str = "cross_entropy";
    check_spec(spec)?;
    let shape = spec.shape;
    let (c, d) = (shape.classes, shape.inner);
    let full = [shape.batch, c, d];
    check_len(OP, "logits", logits, &full)?;
    check_len(OP, "losses", losses, &[shape.batch, d])?;
    if let Some(w) = weight {
        check_len(OP, "weight", w, &[c])?;
    }
    match targets {
        Targets::Indices(t) => {
            check_len(OP, "target", t, &[shape.batch, d])?;
            check_targets(spec, t)?;
        }
        Targets::Probabilities(t) => check_len(OP, "target", t, &full)?,
    }
    if let Some(g) = grad.as_deref() {
        check_len(OP, "grad", g, &full)?;
    }
    if shape.positions() == 0 {
        return Ok(0.0);
    }
    // One row of plain [N, C] logits (D = 1); returns its share of the mean's denominator.
    let sample = |n: usize, loss_row: &mut [T], grad_row: Option<&mut [T]>| -> f64 {
        let z = &logits[n * c..][..c];
        let (target, denom) = match targets {
            Targets::Indices(t) => {
                let y = t[n];
                if y == spec.ignore_index {
                    loss_row[0] = T::ZERO;
                    if let Some(g) = grad_row {
                        g.fill(T::ZERO);
                    }
                    return 0.0;
                }
                let y = y as usize;
                (RowTarget::Label(y), weight.map_or(1.0, |w| w[y].to_f64()))
            }
            Targets::Probabilities(t) => (RowTarget::Probabilities(&t[n * c..][..c]), 1.0),
        };
        loss_row[0] = cpu_row::row(spec, z, target, weight, grad_row);
        denom
    };

    let block = Block {
        spec,
        logits,
        targets,
        weight,
    };
    let run = |n: usize, l: &mut [T], g: Option<&mut [T]>| {
        if d == 1 {
            sample(n, l, g)
        } else {
            block.class_major(n, l, g)
        }
    };
    let denom = crate::threads::install(|| match grad {
        Some(g) => losses
            .par_chunks_mut(d)
            .zip(g.par_chunks_mut(c * d))
            .enumerate()
            .map(|(n, (l, gb))| run(n, l, Some(gb)))
            .sum::<f64>(),
        None => losses
            .par_chunks_mut(d)
            .enumerate()
            .map(|(n, l)| run(n, l, None))
            .sum::<f64>(),
    });
    Ok(match targets {
        Targets::Indices(_) => denom,
        Targets::Probabilities(_) => shape.positions() as f64,
    })
}

/// The inputs of one call, for the class-major sweep of spatial samples.
struct Block<'a, T> {
    spec: &'a CrossEntropySpec,
    logits: &'a [T],
    targets: Targets<'a, T>,
    weight: Option<&'a [T]>,
}

impl<T: KernelFloat> Block<'_, T> {
    /// Sample `n` swept class-major: losses of its `D` positions into `losses`, gradient into
    /// `grad` (`[C, D]`); returns its share of the mean's denominator.
    fn class_major(&self, n: usize, losses: &mut [T], grad: Option<&mut [T]>) -> f64 {
        let CrossEntropyShape {
            classes: c,
            inner: d,
            ..
        } = self.spec.shape;
        let eps = self.spec.label_smoothing;
        let smooth = eps / c as f64;
        let w_of = |k: usize| self.weight.map_or(1.0, |w| w[k].to_f64());
        let x = &self.logits[n * c * d..][..c * d];
        let (labels, probs) = match self.targets {
            Targets::Indices(t) => (Some(&t[n * d..][..d]), None),
            Targets::Probabilities(t) => (None, Some(&t[n * c * d..][..c * d])),
        };
        let q_of = |k: usize, j: usize| match (probs, labels) {
            (Some(p), _) => (1.0 - eps) * p[k * d + j].to_f64() + smooth,
            (None, Some(l)) => smooth + if l[j] == k as i64 { 1.0 - eps } else { 0.0 },
            (None, None) => unreachable!("a call has index or probability targets"),
        };
        // Pass 1, class-major: online max / sum of exp, and the q·w sums, the shifted one moved
        // as the max rises (for index targets only the smoothing part here; the label's share is
        // added per position below).
        let (mut max, mut sum) = (vec![f64::NEG_INFINITY; d], vec![0.0f64; d]);
        let (mut shifted, mut qw) = (vec![0.0f64; d], vec![0.0f64; d]);
        for k in 0..c {
            let wk = w_of(k);
            for (j, v) in x[k * d..][..d].iter().enumerate() {
                let z = v.to_f64();
                if z > max[j] {
                    if qw[j] != 0.0 {
                        shifted[j] += (max[j] - z) * qw[j];
                    }
                    sum[j] = sum[j] * (max[j] - z).exp() + 1.0;
                    max[j] = z;
                } else if z != f64::NEG_INFINITY {
                    sum[j] += (z - max[j]).exp();
                }
                let qwk = match probs {
                    Some(p) => share((1.0 - eps) * p[k * d + j].to_f64() + smooth, wk),
                    None => share(smooth, wk),
                };
                if qwk != 0.0 {
                    shifted[j] += qwk * below(z, max[j]);
                    qw[j] += qwk;
                }
            }
        }
        // Per position: the label's share, the loss, and ln(sum) (kept in `sum`).
        let mut denom = 0.0;
        let mut ignored = vec![false; d];
        for j in 0..d {
            match labels {
                Some(l) if l[j] == self.spec.ignore_index => {
                    ignored[j] = true;
                    losses[j] = T::ZERO;
                    continue;
                }
                Some(l) => {
                    let y = l[j] as usize;
                    let wy = w_of(y);
                    let qwy = share(1.0 - eps, wy);
                    if qwy != 0.0 {
                        shifted[j] += qwy * below(x[y * d + j].to_f64(), max[j]);
                        qw[j] += qwy;
                    }
                    denom += wy;
                }
                None => denom += 1.0,
            }
            sum[j] = sum[j].ln();
            losses[j] = T::from_f64(qw[j] * sum[j] - shifted[j]);
        }
        // Pass 2, class-major: the gradient softmax · S - q w.
        if let Some(g) = grad {
            for k in 0..c {
                let wk = w_of(k);
                let row = &x[k * d..][..d];
                for (j, out) in g[k * d..][..d].iter_mut().enumerate() {
                    *out = if ignored[j] {
                        T::ZERO
                    } else {
                        let p = ((row[j].to_f64() - max[j]) - sum[j]).exp();
                        T::from_f64(p * qw[j] - share(q_of(k, j), wk))
                    };
                }
            }
        }
        denom
    }
}

/// The `T` buffer of a storage, if it holds `T`.
fn buffer_of<T: Copy + 'static>(storage: &CpuStorage) -> Option<&HostBuffer<T>> {
    match storage {
        CpuStorage::F32(b) => (b as &dyn Any).downcast_ref(),
        CpuStorage::F64(b) => (b as &dyn Any).downcast_ref(),
        _ => None,
    }
}

/// An operand as a dense slice of `T`: borrowed in place, or a contiguous `T` copy (a block of
/// the CPU allocator).
enum Dense<'a, T> {
    Borrowed(&'a [T]),
    Converted(CpuStorage),
}

impl<T: Copy + 'static> std::ops::Deref for Dense<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Dense::Borrowed(s) => s,
            Dense::Converted(c) => buffer_of::<T>(c).expect("converted to T").as_slice(),
        }
    }
}

/// The elements of `layout` borrowed in place when the storage holds `T` and the view is
/// dense (the common case: no copy of the logits), else converted to a contiguous `T` storage.
fn dense<'a, T: KernelFloat + crate::Element>(
    storage: &'a CpuStorage,
    layout: &Layout,
) -> Result<Dense<'a, T>> {
    if let (Some(b), Some(offset)) = (buffer_of::<T>(storage), layout.contiguous_offset()) {
        return Ok(Dense::Borrowed(
            &b.as_slice()[offset..offset + layout.numel()],
        ));
    }
    let converted = storage.to_dtype(layout, T::DTYPE)?;
    Ok(Dense::Converted(converted))
}

/// Runs the kernel for element type `T` (the logits' dtype or, for 16-bit floats, `f32`).
fn run_typed<T: KernelFloat + crate::Element>(
    spec: &CrossEntropySpec,
    logits: &CpuStorage,
    layout: &Layout,
    target: &CpuStorage,
    target_layout: &Layout,
    weight: Option<(&CpuStorage, &Layout)>,
) -> Result<(HostBuffer<T>, Option<HostBuffer<T>>, f64)> {
    let x = dense::<T>(logits, layout)?;
    let w = weight.map(|(s, l)| dense::<T>(s, l)).transpose()?;
    let index_targets;
    let prob_targets;
    let targets = match spec.target {
        TargetKind::Indices => {
            index_targets = match target {
                CpuStorage::I64(_) | CpuStorage::U8(_) => target
                    .to_dtype(target_layout, DType::I64)?
                    .to_vec::<i64>()
                    .expect("converted to i64 above"),
                other => return Err(Error::UnsupportedDType {
                    op: "cross_entropy",
                    dtype: other.dtype(),
                    hint: "class-index targets must be integers; convert with to_dtype(DType::I64)",
                }),
            };
            Targets::Indices(&index_targets)
        }
        TargetKind::Probabilities => {
            prob_targets = dense::<T>(target, target_layout)?;
            Targets::Probabilities(&prob_targets)
        }
    };
    // Outputs are written in place into blocks of the CPU allocator.
    // Every element of both is written (an ignored position's with 0).
    let mut losses = HostBuffer::for_overwrite(spec.shape.positions())?;
    let mut grad = match spec.with_grad {
        true => Some(HostBuffer::for_overwrite(spec.shape.logits())?),
        false => None,
    };
    let total = softmax_cross_entropy(
        spec,
        &x,
        targets,
        w.as_deref(),
        &mut losses,
        grad.as_mut().map(HostBuffer::as_mut_slice),
    )?;
    Ok((losses, grad, total))
}

/// The seam for host buffers: dispatches on the logits' dtype (16-bit floats run in `f32` and
/// round their outputs once).
impl LossOps for CpuStorage {
    fn softmax_cross_entropy(
        &self,
        layout: &Layout,
        target: &Self,
        target_layout: &Layout,
        weight: Option<(&Self, &Layout)>,
        spec: &CrossEntropySpec,
    ) -> Result<CrossEntropyOutput<Self>> {
        let logits = self;
        let dtype = logits.dtype();
        match dtype {
            DType::F64 => {
                let (l, g, t) =
                    run_typed::<f64>(spec, logits, layout, target, target_layout, weight)?;
                Ok(CrossEntropyOutput {
                    losses: CpuStorage::F64(l),
                    grad: g.map(CpuStorage::F64),
                    total_weight: CpuStorage::from_vec(vec![t]),
                })
            }
            DType::F32 | DType::F16 | DType::BF16 => {
                let (l, g, t) =
                    run_typed::<f32>(spec, logits, layout, target, target_layout, weight)?;
                // 16-bit logits: the outputs go back to the logits' dtype, rounded once.
                let back = |v: HostBuffer<f32>| {
                    let n = v.len();
                    match dtype {
                        DType::F32 => Ok(CpuStorage::F32(v)),
                        _ => CpuStorage::F32(v).to_dtype(&Layout::contiguous(&[n]), dtype),
                    }
                };
                Ok(CrossEntropyOutput {
                    losses: back(l)?,
                    grad: g.map(back).transpose()?,
                    total_weight: CpuStorage::from_vec(vec![t]),
                })
            }
            other => Err(Error::UnsupportedDType {
                op: "cross_entropy",
                dtype: other,
                hint: "logits must be floating point; convert with to_dtype(DType::F32)",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::loss::{CrossEntropyShape, TargetKind};

    fn spec(batch: usize, classes: usize, inner: usize, target: TargetKind) -> CrossEntropySpec {
        CrossEntropySpec {
            shape: CrossEntropyShape {
                batch,
                classes,
                inner,
            },
            target,
            ignore_index: -100,
            label_smoothing: 0.0,
            with_grad: true,
        }
    }

    #[test]
    fn index_and_one_hot_probability_targets_agree() {
        // [N=2, C=3, D=2] logits; the probability form of the same targets is their one-hot.
        let logits: Vec<f64> = (0..12).map(|i| ((i * 7) % 5) as f64 * 0.3 - 0.5).collect();
        let labels = [2i64, 0, 1, 1];
        let mut probs = vec![0.0; 12];
        for (p, &y) in labels.iter().enumerate() {
            let (n, j) = (p / 2, p % 2);
            probs[n * 6 + y as usize * 2 + j] = 1.0;
        }
        let (mut l1, mut g1) = (vec![0.0; 4], vec![0.0; 12]);
        let (mut l2, mut g2) = (vec![0.0; 4], vec![0.0; 12]);
        let s = spec(2, 3, 2, TargetKind::Indices);
        let t1 = softmax_cross_entropy(
            &s,
            &logits,
            Targets::Indices(&labels),
            None,
            &mut l1,
            Some(&mut g1),
        )
        .unwrap();
        let s = spec(2, 3, 2, TargetKind::Probabilities);
        let t2 = softmax_cross_entropy(
            &s,
            &logits,
            Targets::Probabilities(&probs),
            None,
            &mut l2,
            Some(&mut g2),
        )
        .unwrap();
        assert_eq!((t1, t2), (4.0, 4.0));
        for (a, b) in l1.iter().zip(&l2).chain(g1.iter().zip(&g2)) {
            assert!((a - b).abs() < 1e-15, "{a} vs {b}");
        }
        // Each position's loss is lse - z_y, computed directly here.
        for (p, &y) in labels.iter().enumerate() {
            let (n, j) = (p / 2, p % 2);
            let z = |k: usize| logits[n * 6 + k * 2 + j];
            let lse = (0..3).map(|k| z(k).exp()).sum::<f64>().ln();
            assert!((l1[p] - (lse - z(y as usize))).abs() < 1e-14);
        }
    }

    #[test]
    fn first_bad_target_is_reported_before_anything_is_written() {
        let s = spec(2, 3, 2, TargetKind::Indices);
        let mut losses = vec![7.0f32; 4];
        let err = softmax_cross_entropy(
            &s,
            &[0.0f32; 12],
            Targets::Indices(&[0, -100, 3, -1]),
            None,
            &mut losses,
            None,
        )
        .unwrap_err();
        assert_eq!(
            err,
            KernelError::IndexOutOfRange {
                op: "cross_entropy",
                index: 3,
                position: vec![1, 0],
                dim: 1,
                size: 3
            }
        );
        assert_eq!(losses, vec![7.0; 4]);
    }
}
