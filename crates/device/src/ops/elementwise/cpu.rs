//! CPU elementwise kernels: strided map loops, parallel over output chunks above
//! [`crate::threads::PARALLEL_THRESHOLD`] elements.
//!
//! Inputs are read through their [`Layout`]s (a contiguous input takes a plain slice fast path),
//! outputs are written contiguously into a caller-provided slice (the CPU storage hands in a block
//! of the caching allocator, so no output goes through a `Vec`). Each parallel chunk starts its own [`StridedIndex`] at the
//! chunk's first logical index, so no chunk depends on another.

use super::float::Float;
use crate::backend::{BinaryOp, CmpOp, UnaryOp};
use crate::dtype::{BoolByte, Element};
use crate::layout::{Layout, StridedIndex};
use crate::threads::{cpu_pool, PARALLEL_THRESHOLD};
use rayon::prelude::*;

const CHUNK: usize = 1 << 13;

fn fill_chunks<U: Copy + Send>(out: &mut [U], body: impl Fn(usize, &mut [U]) + Sync) {
    if out.len() > PARALLEL_THRESHOLD {
        cpu_pool().install(|| {
            out.par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(i, chunk)| body(i * CHUNK, chunk))
        });
    } else {
        body(0, out);
    }
}

/// `f` of every element of `src` viewed through `layout`, as a new `Vec` (the allocating form of
/// [`map1_into`], for tests and callers outside the storage).
pub fn map1<T: Copy + Sync, U: Element>(
    src: &[T],
    layout: &Layout,
    f: impl Fn(T) -> U + Sync,
) -> Vec<U> {
    let mut out = vec![U::zero(); layout.numel()];
    map1_into(src, layout, &mut out, f);
    out
}

/// Writes `f` of every element of `src` viewed through `layout` into `out` (contiguous,
/// `layout.numel()` elements).
pub fn map1_into<T: Copy + Sync, U: Copy + Send>(
    src: &[T],
    layout: &Layout,
    out: &mut [U],
    f: impl Fn(T) -> U + Sync,
) {
    debug_assert_eq!(out.len(), layout.numel());
    let contiguous = layout.contiguous_offset();
    fill_chunks(out, |start, chunk| match contiguous {
        Some(base) => {
            let s = &src[base + start..base + start + chunk.len()];
            for (o, &v) in chunk.iter_mut().zip(s) {
                *o = f(v);
            }
        }
        None => {
            for (o, i) in chunk.iter_mut().zip(StridedIndex::new(layout, start)) {
                *o = f(src[i]);
            }
        }
    });
}

/// Writes `f(a, b)` elementwise over two same-shaped layouts into `out` (contiguous).
pub fn map2<A: Copy + Sync, B: Copy + Sync, U: Copy + Send>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    out: &mut [U],
    f: impl Fn(A, B) -> U + Sync,
) {
    debug_assert_eq!(out.len(), la.numel());
    let (ca, cb) = (la.contiguous_offset(), lb.contiguous_offset());
    fill_chunks(out, |start, chunk| {
        let n = chunk.len();
        match (ca, cb) {
            (Some(oa), Some(ob)) => {
                let (sa, sb) = (
                    &a[oa + start..oa + start + n],
                    &b[ob + start..ob + start + n],
                );
                for ((o, &x), &y) in chunk.iter_mut().zip(sa).zip(sb) {
                    *o = f(x, y);
                }
            }
            (Some(oa), None) => {
                let sa = &a[oa + start..oa + start + n];
                for ((o, &x), j) in chunk.iter_mut().zip(sa).zip(StridedIndex::new(lb, start)) {
                    *o = f(x, b[j]);
                }
            }
            _ => {
                let ia = StridedIndex::new(la, start);
                let ib = StridedIndex::new(lb, start);
                for ((o, i), j) in chunk.iter_mut().zip(ia).zip(ib) {
                    *o = f(a[i], b[j]);
                }
            }
        }
    });
}

/// Writes `f(a, b, c)` elementwise over three same-shaped layouts into `out` (contiguous).
pub fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, U: Copy + Send>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    (c, lc): (&[C], &Layout),
    out: &mut [U],
    f: impl Fn(A, B, C) -> U + Sync,
) {
    debug_assert_eq!(out.len(), la.numel());
    fill_chunks(out, |start, chunk| {
        let ia = StridedIndex::new(la, start);
        let ib = StridedIndex::new(lb, start);
        let ic = StridedIndex::new(lc, start);
        for (((o, i), j), k) in chunk.iter_mut().zip(ia).zip(ib).zip(ic) {
            *o = f(a[i], b[j], c[k]);
        }
    });
}

#[inline]
fn sigmoid<F: Float>(x: F) -> F {
    F::c(1.0) / (F::c(1.0) + (-x).exp())
}

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_TANH_COEF: f64 = 0.044715;

/// A float unary op on `src` through `layout`, written into `out` (`layout.numel()` elements).
pub fn unary_float<F: Float>(src: &[F], layout: &Layout, op: UnaryOp, out: &mut [F]) {
    let one = F::c(1.0);
    let half = F::c(0.5);
    let zero = F::c(0.0);
    match op {
        UnaryOp::Neg => map1_into(src, layout, out, |x: F| -x),
        UnaryOp::Exp => map1_into(src, layout, out, |x: F| x.exp()),
        UnaryOp::Log => map1_into(src, layout, out, |x: F| x.ln()),
        UnaryOp::Sqrt => map1_into(src, layout, out, |x: F| x.sqrt()),
        UnaryOp::Rsqrt => map1_into(src, layout, out, |x: F| one / x.sqrt()),
        UnaryOp::Abs => map1_into(src, layout, out, |x: F| x.abs()),
        UnaryOp::Relu => map1_into(src, layout, out, |x: F| {
            if x > zero || x.is_nan() {
                x
            } else {
                zero
            }
        }),
        UnaryOp::GeluErf => map1_into(src, layout, out, |x: F| {
            half * x * (one + (x * F::c(std::f64::consts::FRAC_1_SQRT_2)).erf())
        }),
        UnaryOp::GeluTanh => map1_into(src, layout, out, |x: F| {
            half * x
                * (one + (F::c(SQRT_2_OVER_PI) * (x + F::c(GELU_TANH_COEF) * x * x * x)).tanh())
        }),
        UnaryOp::Sigmoid => map1_into(src, layout, out, sigmoid),
        UnaryOp::Tanh => map1_into(src, layout, out, |x: F| x.tanh()),
        UnaryOp::Silu => map1_into(src, layout, out, |x: F| x * sigmoid(x)),
        UnaryOp::Sign => map1_into(src, layout, out, |x: F| {
            if x > zero {
                one
            } else if x < zero {
                -one
            } else {
                x
            }
        }),
        UnaryOp::Erf => map1_into(src, layout, out, |x: F| x.erf()),
        UnaryOp::Recip => map1_into(src, layout, out, |x: F| one / x),
        UnaryOp::Square => map1_into(src, layout, out, |x: F| x * x),
        UnaryOp::ReluGrad => map1_into(src, layout, out, |x: F| if x > zero { one } else { zero }),
        UnaryOp::GeluErfGrad => map1_into(src, layout, out, |x: F| {
            let cdf = half * (one + (x * F::c(std::f64::consts::FRAC_1_SQRT_2)).erf());
            let pdf = (-half * x * x).exp() * F::c(0.398_942_280_401_432_7);
            cdf + x * pdf
        }),
        UnaryOp::GeluTanhGrad => map1_into(src, layout, out, |x: F| {
            let inner = F::c(SQRT_2_OVER_PI) * (x + F::c(GELU_TANH_COEF) * x * x * x);
            let t = inner.tanh();
            let dinner = F::c(SQRT_2_OVER_PI) * (one + F::c(3.0 * GELU_TANH_COEF) * x * x);
            half * (one + t) + half * x * (one - t * t) * dinner
        }),
        UnaryOp::SiluGrad => map1_into(src, layout, out, |x: F| {
            let s = sigmoid(x);
            s * (one + x * (one - s))
        }),
    }
}

/// An integer unary op (those that make sense on integers) written into `out`, or `None` (and
/// `out` untouched) when it does not make sense.
pub fn unary_int(src: &[i64], layout: &Layout, op: UnaryOp, out: &mut [i64]) -> Option<()> {
    match op {
        UnaryOp::Neg => map1_into(src, layout, out, |x: i64| x.wrapping_neg()),
        UnaryOp::Abs => map1_into(src, layout, out, |x: i64| x.wrapping_abs()),
        UnaryOp::Relu => map1_into(src, layout, out, |x: i64| x.max(0)),
        UnaryOp::Sign => map1_into(src, layout, out, |x: i64| x.signum()),
        UnaryOp::Square => map1_into(src, layout, out, |x: i64| x.wrapping_mul(x)),
        _ => return None,
    }
    Some(())
}

#[inline]
fn nan_max<F: Float>(a: F, b: F) -> F {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

#[inline]
fn nan_min<F: Float>(a: F, b: F) -> F {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// A float binary op, written into `out` (`la.numel()` elements).
pub fn binary_float<F: Float>(
    a: &[F],
    la: &Layout,
    b: &[F],
    lb: &Layout,
    op: BinaryOp,
    out: &mut [F],
) {
    let (a, b) = ((a, la), (b, lb));
    match op {
        BinaryOp::Add => map2(a, b, out, |x: F, y: F| x + y),
        BinaryOp::Sub => map2(a, b, out, |x: F, y: F| x - y),
        BinaryOp::Mul => map2(a, b, out, |x: F, y: F| x * y),
        BinaryOp::Div => map2(a, b, out, |x: F, y: F| x / y),
        BinaryOp::Pow => map2(a, b, out, |x: F, y: F| x.powf(y)),
        BinaryOp::Maximum => map2(a, b, out, nan_max),
        BinaryOp::Minimum => map2(a, b, out, nan_min),
    }
}

/// An integer binary op written into `out`; `None` (and `out` untouched) for `Pow`. Division by
/// zero gives 0 instead of a panic (PyTorch raises); kiln-autograd checks for it before calling.
pub fn binary_int(
    a: &[i64],
    la: &Layout,
    b: &[i64],
    lb: &Layout,
    op: BinaryOp,
    out: &mut [i64],
) -> Option<()> {
    let (a, b) = ((a, la), (b, lb));
    match op {
        BinaryOp::Add => map2(a, b, out, |x: i64, y: i64| x.wrapping_add(y)),
        BinaryOp::Sub => map2(a, b, out, |x: i64, y: i64| x.wrapping_sub(y)),
        BinaryOp::Mul => map2(a, b, out, |x: i64, y: i64| x.wrapping_mul(y)),
        BinaryOp::Div => map2(a, b, out, |x: i64, y: i64| x.checked_div(y).unwrap_or(0)),
        BinaryOp::Maximum => map2(a, b, out, |x: i64, y: i64| x.max(y)),
        BinaryOp::Minimum => map2(a, b, out, |x: i64, y: i64| x.min(y)),
        BinaryOp::Pow => return None,
    }
    Some(())
}

/// A comparison over any ordered element type, written into the `Bool` slice `out`.
pub fn compare<T: Element>(
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    op: CmpOp,
    out: &mut [BoolByte],
) {
    let f = move |x: T, y: T| -> BoolByte {
        BoolByte(match op {
            CmpOp::Eq => x == y,
            CmpOp::Ne => x != y,
            CmpOp::Lt => x < y,
            CmpOp::Le => x <= y,
            CmpOp::Gt => x > y,
            CmpOp::Ge => x >= y,
        } as u8)
    };
    map2((a, la), (b, lb), out, f)
}

/// `cond ? t : f` elementwise into `out`; `cond` is a byte buffer (Bool or U8).
pub fn where_cond<T: Element>(
    cond: (&[u8], &Layout),
    on_true: (&[T], &Layout),
    on_false: (&[T], &Layout),
    out: &mut [T],
) {
    map3(
        cond,
        on_true,
        on_false,
        out,
        |c: u8, t: T, f: T| if c != 0 { t } else { f },
    )
}
