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
//! thread count, of the batching of chunks into tasks and of the instruction set the loop runs
//! in (the per-element loop has no branch, so it vectorises like the Adam step's).

use super::slices::{same_len, typed, typed_mut, StepFloat};
use super::tasks::{chunk_count, into_tasks};
use crate::ops::multi_tensor::{SgdHyper, SgdOperands, CHUNK_ELEMS};
use crate::ops::simd::{self, simd_dispatch};
use crate::CpuStorage;
use rayon::prelude::*;

struct SgdChunk<'a, T> {
    p: &'a mut [T],
    g: &'a [T],
    buf: Option<&'a mut [T]>,
    first: bool,
}

/// The per-step constants of the update, rounded to the parameter dtype.
struct SgdConsts<T> {
    /// `grad_scale`, negated when maximizing (negating and multiplying by 1 are exact, so one
    /// multiply covers both, bit for bit as a separate scale and negation).
    gsm: T,
    wd: T,
    mom: T,
    damp: T,
    /// `-lr`.
    lr: T,
}

/// One fused pass over every parameter of `list` (all of dtype `T`, checked here).
pub(super) fn sgd_pass<T: StepFloat>(
    op: &'static str,
    list: &mut [SgdOperands<'_, CpuStorage>],
    o: &SgdHyper,
) -> crate::Result<()> {
    let n_chunks = chunk_count(list.iter().map(|w| (&*w.param.0, w.param.1)));
    let mut chunks: Vec<SgdChunk<'_, T>> = Vec::with_capacity(n_chunks);
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
    let c = SgdConsts {
        gsm: T::c(if o.maximize {
            -o.grad_scale
        } else {
            o.grad_scale
        }),
        wd: T::c(o.weight_decay),
        mom: T::c(o.momentum),
        damp: T::c(1.0 - o.dampening),
        lr: T::c(-o.lr),
    };
    let (wd, nesterov) = (o.weight_decay != 0.0, o.nesterov);
    let batches = into_tasks(chunks, |c| c.p.len());
    let isa = simd::isa();
    crate::threads::install(|| {
        batches
            .into_par_iter()
            .flatten_iter()
            .for_each(|ch| match (wd, nesterov) {
                (true, true) => sgd_chunk::<T, true, true>(isa, &c, ch),
                (true, false) => sgd_chunk::<T, true, false>(isa, &c, ch),
                (false, true) => sgd_chunk::<T, false, true>(isa, &c, ch),
                (false, false) => sgd_chunk::<T, false, false>(isa, &c, ch),
            });
    });
    Ok(())
}

simd_dispatch! {
    /// The update of one chunk, in the widest vector instructions the CPU has (as the Adam
    /// step: kiln is compiled for 128-bit SSE, `simd.rs` adds AVX-512 and AVX2 builds). Every
    /// path does the same multiplies and adds per element (never fused), so the same bits.
    fn sgd_chunk[T: StepFloat, const WD: bool, const NESTEROV: bool](
        c: &SgdConsts<T>,
        ch: SgdChunk<'_, T>,
    ) => sgd_body[T, WD, NESTEROV];
}

/// The update of one chunk; `WD` adds weight decay to the gradient, `NESTEROV` looks ahead
/// along the momentum. Branch-free per element so the loops vectorise (the flags are constants
/// and the momentum cases separate loops).
#[inline(always)]
fn sgd_body<T: StepFloat, const WD: bool, const NESTEROV: bool>(
    c: &SgdConsts<T>,
    ch: SgdChunk<'_, T>,
) {
    let SgdChunk { p, g, buf, first } = ch;
    let grad = |p: T, g: T| {
        let d = g * c.gsm;
        if WD {
            d + p * c.wd
        } else {
            d
        }
    };
    // The new parameter from the old one, the gradient and the new buffer value (computed from
    // locals, so nothing is loaded again after a store: see `adam_body`).
    let step = |p: T, d: T, b: T| {
        let d = if NESTEROV { d + b * c.mom } else { b };
        p + d * c.lr
    };
    match buf {
        None => {
            for (p, &g) in p.iter_mut().zip(g) {
                *p += grad(*p, g) * c.lr;
            }
        }
        // The buffer's first step takes the gradient as it is.
        Some(b) if first => {
            for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
                let (p0, d) = (*p, grad(*p, g));
                *b = d;
                *p = step(p0, d, d);
            }
        }
        Some(b) => {
            for ((p, &g), b) in p.iter_mut().zip(g).zip(b.iter_mut()) {
                let (p0, d) = (*p, grad(*p, g));
                let bn = *b * c.mom + d * c.damp;
                *b = bn;
                *p = step(p0, d, bn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{canonical_bits, special_values};
    use super::*;
    use crate::Layout;

    /// The update as the module docs write it, one element at a time and one operation after
    /// another: scale only when `grad_scale != 1`, negate only when maximizing, decay only with
    /// a weight decay.
    fn reference(o: &SgdHyper, p: &mut [f32], g: &[f32], mut buf: Option<&mut [f32]>, first: bool) {
        let (mom, damp) = (o.momentum as f32, (1.0 - o.dampening) as f32);
        for i in 0..p.len() {
            let mut d = g[i];
            if o.grad_scale != 1.0 {
                d *= o.grad_scale as f32;
            }
            if o.maximize {
                d = -d;
            }
            if o.weight_decay != 0.0 {
                d += p[i] * o.weight_decay as f32;
            }
            if let Some(b) = buf.as_deref_mut() {
                b[i] = if first { d } else { b[i] * mom + d * damp };
                d = if o.nesterov { d + b[i] * mom } else { b[i] };
            }
            p[i] += d * (-o.lr) as f32;
        }
    }

    /// Every combination of the step's options (weight decay, Nesterov, maximize, a gradient
    /// scale, no momentum / the buffer's first step / a later step) over values with zeros,
    /// infinities and NaN: the fused pass gives the reference's bits.
    #[test]
    fn the_step_equals_the_reference_update_for_every_option() {
        // An odd length, so the vector paths also run their scalar tails.
        let n = 1000 + 13;
        let g = special_values(2, n);
        for bits in 0..32u32 {
            let flag = |k: u32| bits & (1 << k) != 0;
            let (momentum, first) = match (flag(3), flag(4)) {
                (false, _) => (0.0, false),
                (true, first) => (0.9, first),
            };
            let o = SgdHyper {
                lr: 0.1,
                momentum,
                dampening: 0.25,
                weight_decay: if flag(0) { 1e-3 } else { 0.0 },
                nesterov: flag(1) && momentum != 0.0,
                maximize: flag(2),
                grad_scale: if bits % 3 == 0 { 0.5 } else { 1.0 },
            };
            let (mut p, mut b) = (special_values(1, n), special_values(3, n));
            let (mut want_p, mut want_b) = (p.clone(), b.clone());
            let with_buf = momentum != 0.0;
            reference(
                &o,
                &mut want_p,
                &g,
                with_buf.then_some(&mut want_b[..]),
                first,
            );
            let (mut ps, gs, mut bs) = (
                CpuStorage::from_vec(p.clone()),
                CpuStorage::from_vec(g.clone()),
                CpuStorage::from_vec(b.clone()),
            );
            let layout = Layout::contiguous(&[n]);
            let mut list = [SgdOperands {
                param: (&mut ps, &layout),
                grad: (&gs, &layout),
                momentum_buffer: with_buf.then_some((&mut bs, &layout)),
                first_momentum_step: first,
            }];
            sgd_pass::<f32>("SGD", &mut list, &o).unwrap();
            (p, b) = (ps.to_vec::<f32>().unwrap(), bs.to_vec::<f32>().unwrap());
            assert_eq!(
                canonical_bits(&p),
                canonical_bits(&want_p),
                "{o:?} first {first}"
            );
            assert_eq!(
                canonical_bits(&b),
                canonical_bits(&want_b),
                "{o:?} first {first}"
            );
        }
    }

    /// Each instruction set this CPU has gives the portable build's bits, on every variant.
    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let n = 1000 + 13;
        let c = SgdConsts {
            gsm: -0.5,
            wd: 1e-3,
            mom: 0.9,
            damp: 0.75,
            lr: -0.1,
        };
        let g = special_values(2, n);
        type Step<'s> = &'s dyn Fn(SgdChunk<'_, f32>);
        let run = |step: Step<'_>, buf: bool, first: bool| {
            let (mut p, mut b) = (special_values(1, n), special_values(3, n));
            step(SgdChunk {
                p: &mut p,
                g: &g,
                buf: buf.then_some(&mut b[..]),
                first,
            });
            [canonical_bits(&p), canonical_bits(&b)]
        };
        let isas = std::iter::once(simd::isa()).chain(simd::available().into_iter().map(Some));
        for isa in isas {
            for (buf, first) in [(false, false), (true, true), (true, false)] {
                let cases: [(Step<'_>, Step<'_>); 4] = [
                    (&|ch| sgd_body::<f32, true, true>(&c, ch), &|ch| {
                        sgd_chunk::<f32, true, true>(isa, &c, ch)
                    }),
                    (&|ch| sgd_body::<f32, true, false>(&c, ch), &|ch| {
                        sgd_chunk::<f32, true, false>(isa, &c, ch)
                    }),
                    (&|ch| sgd_body::<f32, false, true>(&c, ch), &|ch| {
                        sgd_chunk::<f32, false, true>(isa, &c, ch)
                    }),
                    (&|ch| sgd_body::<f32, false, false>(&c, ch), &|ch| {
                        sgd_chunk::<f32, false, false>(isa, &c, ch)
                    }),
                ];
                for (k, (portable, dispatched)) in cases.iter().enumerate() {
                    assert_eq!(
                        run(*portable, buf, first),
                        run(*dispatched, buf, first),
                        "{isa:?}, variant {k}, buffer {buf}, first {first}"
                    );
                }
            }
        }
    }
}
