//! The CPU Adam/AdamW step: PyTorch's update, step for step, over fixed chunks of every
//! parameter of a list (zipped with its gradient and moments), the chunks run in parallel.
//!
//! ```text
//! g = grad * grad_scale (negated when maximize)
//! Adam:  g += weight_decay * p            AdamW:  p *= 1 - lr * weight_decay
//! m = lerp(m, g, w), w = 1 - beta1         (PyTorch's two forms: m + w * (g - m) when |w| < 0.5,
//!                                          else g - (g - m) * (1 - w), exact at w = 1)
//! v = beta2 * v + (1 - beta2) * g * g
//! vmax = max(vmax, v)                     (amsgrad; the denominator then uses vmax)
//! denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//! p = p - lr / (1 - beta1^t) * m / denom
//! ```
//!
//! Invariants: every constant is rounded to the parameter dtype once, per step, the same way
//! as the CUDA kernel rounds it; each multiply and add rounds in that dtype, so results are
//! bitwise independent of the thread count and of how chunks are batched into tasks.

use super::slices::{same_len, typed, typed_mut, StepFloat};
use super::tasks::{chunk_count, into_tasks};
use crate::ops::multi_tensor::{AdamHyper, AdamOperands, AdamStepScalars, CHUNK_ELEMS};
use crate::ops::simd::{self, simd_dispatch};
use crate::CpuStorage;
use rayon::prelude::*;

struct AdamChunk<'a, T> {
    p: &'a mut [T],
    g: &'a [T],
    m: &'a mut [T],
    v: &'a mut [T],
    vmax: Option<&'a mut [T]>,
    k: AdamStepScalars,
}

/// The per-step constants of the update, rounded to the parameter dtype.
struct AdamConsts<T> {
    b1w: T,
    /// `1 - b1w`, rounded in `T` as PyTorch's lerp computes it.
    b1c: T,
    b2: T,
    b2w: T,
    eps: T,
    wd: T,
    decay: T,
    gsm: T,
}

/// One fused pass over every parameter of `list` (all of dtype `T`, checked here).
pub(super) fn adam_pass<T: StepFloat>(
    op: &'static str,
    list: &mut [AdamOperands<'_, CpuStorage>],
    o: &AdamHyper,
) -> crate::Result<()> {
    let n_chunks = chunk_count(list.iter().map(|w| (&*w.param.0, w.param.1)));
    let mut chunks: Vec<AdamChunk<'_, T>> = Vec::with_capacity(n_chunks);
    for w in list.iter_mut() {
        let len = w.param.1.numel();
        let p = typed_mut::<T>(op, (&mut *w.param.0, w.param.1))?;
        let g = typed::<T>(op, w.grad)?;
        let m = typed_mut::<T>(op, (&mut *w.exp_avg.0, w.exp_avg.1))?;
        let v = typed_mut::<T>(op, (&mut *w.exp_avg_sq.0, w.exp_avg_sq.1))?;
        same_len(op, len, &[g.len(), m.len(), v.len()])?;
        let mut xs = match w.max_exp_avg_sq.as_mut() {
            Some((st, layout)) => {
                let x = typed_mut::<T>(op, (&mut **st, layout))?;
                same_len(op, len, &[x.len()])?;
                Some(x.chunks_mut(CHUNK_ELEMS))
            }
            None => None,
        };
        let pieces = p
            .chunks_mut(CHUNK_ELEMS)
            .zip(g.chunks(CHUNK_ELEMS))
            .zip(m.chunks_mut(CHUNK_ELEMS))
            .zip(v.chunks_mut(CHUNK_ELEMS));
        for (((p, g), m), v) in pieces {
            chunks.push(AdamChunk {
                p,
                g,
                m,
                v,
                vmax: xs.as_mut().and_then(Iterator::next),
                k: w.scalars,
            });
        }
    }
    let b1w = T::c(1.0 - o.beta1);
    // PyTorch's lerp takes its second form for a weight of 0.5 or more (beta1 <= 0.5), which
    // is exact where the first cancels (beta1 = 0: m becomes the gradient itself).
    let small_weight = b1w.to_f64().abs() < 0.5;
    let c = AdamConsts {
        b1w,
        b1c: T::c(1.0) - b1w,
        b2: T::c(o.beta2),
        b2w: T::c(1.0 - o.beta2),
        eps: T::c(o.eps),
        wd: T::c(o.weight_decay),
        decay: T::c(1.0 - o.lr * o.weight_decay),
        // Negating and multiplying by 1 are exact, so one multiply covers maximize and scale.
        gsm: T::c(if o.maximize {
            -o.grad_scale
        } else {
            o.grad_scale
        }),
    };
    let has_wd = o.weight_decay != 0.0;
    let (l2, decay) = (has_wd && !o.decoupled, has_wd && o.decoupled);
    let batches = into_tasks(chunks, |c| c.p.len());
    let isa = simd::isa();
    crate::threads::install(|| {
        batches
            .into_par_iter()
            .flatten_iter()
            .for_each(|ch| match (l2, decay, small_weight) {
                (true, _, true) => adam_chunk::<T, true, false, true>(isa, &c, ch),
                (false, true, true) => adam_chunk::<T, false, true, true>(isa, &c, ch),
                (false, false, true) => adam_chunk::<T, false, false, true>(isa, &c, ch),
                (true, _, false) => adam_chunk::<T, true, false, false>(isa, &c, ch),
                (false, true, false) => adam_chunk::<T, false, true, false>(isa, &c, ch),
                (false, false, false) => adam_chunk::<T, false, false, false>(isa, &c, ch),
            });
    });
    Ok(())
}

simd_dispatch! {
    /// The update of one chunk, in the widest vector instructions the CPU has: kiln is
    /// compiled for the x86-64 baseline (128-bit SSE), so the same loop is also compiled for
    /// AVX-512 and for AVX2 (`simd.rs`). Every path does the same multiplies, adds, square roots
    /// and divisions per element (none is fused: Rust never contracts a multiply and an add),
    /// so the results are bitwise the same on every path, but for the sign and payload of a NaN
    /// (a NaN stays a NaN).
    fn adam_chunk[T: StepFloat, const L2: bool, const DECAY: bool, const SMALL: bool](
        c: &AdamConsts<T>,
        ch: AdamChunk<'_, T>,
    ) => adam_body[T, L2, DECAY, SMALL];
}

/// The update of one chunk; `L2` adds weight decay to the gradient (Adam), `DECAY` shrinks the
/// parameter first (AdamW), `SMALL` picks the first moment's lerp form (`|1 - beta1| < 0.5`).
/// Branch-free per element so the loop vectorises.
///
/// Each element's values are read once into locals and the results stored once at the end.
/// The chunk's slices come out of a struct, so the compiler cannot know they never overlap:
/// updating them in place made it load the parameter and the first moment again after every
/// store, and on a Zen 2 CPU those loads waited on the stores before them (the allocator's
/// blocks share their address bits below 4 KiB), which halved the step's speed.
#[inline(always)]
fn adam_body<T: StepFloat, const L2: bool, const DECAY: bool, const SMALL: bool>(
    c: &AdamConsts<T>,
    ch: AdamChunk<'_, T>,
) {
    let AdamChunk {
        p,
        g,
        m,
        v,
        vmax,
        k,
    } = ch;
    let (step, bc2) = (T::c(-k.step_size), T::c(k.bias_correction2_sqrt));
    // The parameter after the decay (AdamW), and the new moments.
    let moments = |p: T, g: T, m: T, v: T| {
        let mut d = g * c.gsm;
        let p = if DECAY { p * c.decay } else { p };
        if L2 {
            d += p * c.wd;
        }
        let m = if SMALL {
            m + c.b1w * (d - m)
        } else {
            d - (d - m) * c.b1c
        };
        (p, m, v * c.b2 + c.b2w * d * d)
    };
    match vmax {
        None => {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                let (pd, mn, vn) = moments(*p, g, *m, *v);
                let denom = vn.sqrt() / bc2 + c.eps;
                (*m, *v) = (mn, vn);
                *p = pd + step * (mn / denom);
            }
        }
        Some(x) => {
            let lanes = p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut());
            for ((((p, &g), m), v), x) in lanes.zip(x.iter_mut()) {
                let (pd, mn, vn) = moments(*p, g, *m, *v);
                // torch.maximum: NaN wins.
                let xn = if vn > *x || vn.is_nan() { vn } else { *x };
                let denom = xn.sqrt() / bc2 + c.eps;
                (*m, *v, *x) = (mn, vn, xn);
                *p = pd + step * (mn / denom);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{canonical_bits as bits, special_values as values};
    use super::*;

    /// Runs one chunk through `step` from the same start (first-moment weight `b1w`); the
    /// parameters and moments after.
    fn run(
        step: impl Fn(&AdamConsts<f32>, AdamChunk<'_, f32>),
        amsgrad: bool,
        b1w: f32,
    ) -> [Vec<u32>; 4] {
        // An odd length, so every path also runs its scalar tail.
        let n = 1000 + 13;
        let (mut p, g, mut m, mut v) = (values(1, n), values(2, n), values(3, n), values(4, n));
        let mut x = values(5, n);
        let c = AdamConsts {
            b1w,
            b1c: 1.0 - b1w,
            b2: 0.999,
            b2w: 0.001,
            eps: 1e-8,
            wd: 0.01,
            decay: 0.99999,
            gsm: -1.5,
        };
        let k = AdamStepScalars {
            step_size: 1e-3 / 0.19,
            bias_correction2_sqrt: 0.0447,
        };
        let vmax = amsgrad.then_some(&mut x[..]);
        step(
            &c,
            AdamChunk {
                p: &mut p,
                g: &g,
                m: &mut m,
                v: &mut v,
                vmax,
                k,
            },
        );
        [bits(&p), bits(&m), bits(&v), bits(&x)]
    }

    /// The three weight-decay variants with lerp form `SMALL`: the plain function for `None`,
    /// else dispatched to the instruction set given.
    fn variants<const SMALL: bool>(
        isa: Option<Option<simd::Isa>>,
        amsgrad: bool,
    ) -> Vec<[Vec<u32>; 4]> {
        let b1w = if SMALL { 0.1 } else { 0.7 };
        match isa {
            None => vec![
                run(adam_body::<f32, false, true, SMALL>, amsgrad, b1w),
                run(adam_body::<f32, true, false, SMALL>, amsgrad, b1w),
                run(adam_body::<f32, false, false, SMALL>, amsgrad, b1w),
            ],
            Some(isa) => vec![
                run(
                    |c, ch| adam_chunk::<f32, false, true, SMALL>(isa, c, ch),
                    amsgrad,
                    b1w,
                ),
                run(
                    |c, ch| adam_chunk::<f32, true, false, SMALL>(isa, c, ch),
                    amsgrad,
                    b1w,
                ),
                run(
                    |c, ch| adam_chunk::<f32, false, false, SMALL>(isa, c, ch),
                    amsgrad,
                    b1w,
                ),
            ],
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        for amsgrad in [false, true] {
            let base = [
                variants::<true>(None, amsgrad),
                variants::<false>(None, amsgrad),
            ];
            // The best instruction set, then each one this CPU has, on all six variants.
            let isas = std::iter::once(simd::isa()).chain(simd::available().into_iter().map(Some));
            for isa in isas {
                let dispatched = [
                    variants::<true>(Some(isa), amsgrad),
                    variants::<false>(Some(isa), amsgrad),
                ];
                assert_eq!(base, dispatched, "{isa:?}, amsgrad {amsgrad}");
            }
            if simd::available().is_empty() {
                eprintln!("only the portable build is checked: no AVX-512F or AVX2 + FMA here");
            }
        }
    }
}
