//! The CPU SGD step: PyTorch's `torch.optim.SGD` update, step for step, over fixed chunks of
//! every parameter of a list (zipped with its gradient and momentum buffer), in parallel.
//!
//! ```text
//! g = grad * grad_scale (negated when maximize); g += weight_decay * p
//! if momentum != 0:
//!     buf = g at the first step, else buf = momentum * buf + (1 - dampening) * g
//!     g = g + momentum * buf when nesterov, else buf
//! p -= lr * g
//! ```
//!
//! Invariants: constants are rounded to the parameter dtype once per step, every multiply and
//! add rounds separately (as the CUDA kernel does), so results are bitwise independent of the
//! thread count and of the batching of chunks into tasks.

use super::slices::{same_len, typed, typed_mut, StepFloat};
use crate::ops::multi_tensor::{batch_ranges, SgdHyper, SgdOperands, CHUNK_ELEMS};
use crate::CpuStorage;
use rayon::prelude::*;

struct SgdChunk<'a, T> {
    p: &'a mut [T],
    g: &'a [T],
    buf: Option<&'a mut [T]>,
    first: bool,
}

/// One fused pass over every parameter of `list` (all of dtype `T`, checked here).
pub(super) fn sgd_pass<T: StepFloat>(
    op: &'static str,
    list: &mut [SgdOperands<'_, CpuStorage>],
    o: &SgdHyper,
) -> crate::Result<()> {
    let mut chunks: Vec<SgdChunk<'_, T>> = Vec::new();
    for w in list.iter_mut() {
        let len = w.param.1.numel();
        let p = typed_mut::<T>(op, (&mut *w.param.0, w.param.1))?;
        let g = typed::<T>(op, w.grad)?;
        same_len(op, len, &[g.len()])?;
        let mut bufs = match w.momentum_buffer.as_mut() {
            Some((st, layout)) => {
                let b = typed_mut::<T>(op, (&mut **st, layout))?;
                same_len(op, len, &[b.len()])?;
                Some(b.chunks_mut(CHUNK_ELEMS))
            }
            None => None,
        };
        let pieces = p.chunks_mut(CHUNK_ELEMS).zip(g.chunks(CHUNK_ELEMS));
        for (pc, gc) in pieces {
            chunks.push(SgdChunk {
                p: pc,
                g: gc,
                buf: bufs.as_mut().and_then(Iterator::next),
                first: w.first_momentum_step,
            });
        }
    }
    let (lr, wd, mom) = (T::c(-o.lr), T::c(o.weight_decay), T::c(o.momentum));
    let damp = T::c(1.0 - o.dampening);
    let gs = T::c(o.grad_scale);
    let (scaled, has_wd, nesterov, maximize) = (
        o.grad_scale != 1.0,
        o.weight_decay != 0.0,
        o.nesterov,
        o.maximize,
    );
    let tasks = batch_ranges(chunks.iter().map(|c| c.p.len()), CHUNK_ELEMS);
    let mut it = chunks.into_iter();
    let batches: Vec<Vec<SgdChunk<'_, T>>> = tasks
        .into_iter()
        .map(|r| it.by_ref().take(r.len()).collect())
        .collect();
    crate::threads::install(|| {
        batches.into_par_iter().flatten_iter().for_each(|c| {
            let SgdChunk {
                p,
                g,
                mut buf,
                first,
            } = c;
            for i in 0..p.len() {
                let mut d = g[i];
                if scaled {
                    d *= gs;
                }
                if maximize {
                    d = -d;
                }
                if has_wd {
                    d += p[i] * wd;
                }
                if let Some(b) = buf.as_deref_mut() {
                    b[i] = if first { d } else { b[i] * mom + d * damp };
                    d = if nesterov { d + b[i] * mom } else { b[i] };
                }
                p[i] += d * lr;
            }
        });
    });
    Ok(())
}
