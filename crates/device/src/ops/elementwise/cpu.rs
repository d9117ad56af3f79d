//! CPU elementwise kernels over the strided map loops of `crate::ops::strided` (re-exported
//! here), and [`ElementwiseOps`] for host buffers.
//!
//! Outputs are written contiguously into a caller-provided slice (the CPU storage hands in a
//! block of the caching allocator, so no output goes through a `Vec`); `F16`/`BF16` operands are
//! computed in `f32` and rounded once (`crate::ops::cpu_dispatch`).

use super::cpu_assign::{assign_through, assign_through_vectorised, check_in_place};
use super::ElementwiseOps;
use super::{BinaryOp, CmpOp, UnaryOp};
use crate::dtype::DType;
use crate::dtype::{BoolByte, Element};
use crate::layout::Layout;
use crate::ops::activation_math::{self as math, GELU_TANH_COEF, SQRT_2_OVER_PI};
use crate::ops::cpu_dispatch::{
    as_condition, buffer_of, finish_cast, float_dispatch, float_op, output, read_as, same_dtype,
    unsupported, FLOAT_HINT,
};
pub use crate::ops::strided::{map1, map1_into, map2, map2_assign, map3};
use crate::ops::strided::{map1_into_vectorised, map2_vectorised};
use crate::ops::KernelFloat;
use crate::storage::{with_slice, HostElement};
use crate::{CpuStorage, Result};

#[inline]
fn sigmoid<F: KernelFloat>(x: F) -> F {
    F::c(1.0) / (F::c(1.0) + (-x).exp())
}

/// `wide` of `x` in `f64` rounded once where `F` computes its activations that way
/// ([`KernelFloat::WIDE_ACTIVATIONS`], `f32`); libm's `exact` otherwise (`f64`).
#[inline(always)]
fn activation<F: KernelFloat>(x: F, wide: impl Fn(f64) -> f64, exact: impl Fn(F) -> F) -> F {
    if F::WIDE_ACTIVATIONS {
        F::from_f64(wide(x.to_f64()))
    } else {
        exact(x)
    }
}

/// An activation's backward, as [`activation`]: `wide(g, x)` or `exact(g, x)`.
#[inline(always)]
fn activation_backward<F: KernelFloat>(
    (g, x): (F, F),
    wide: impl Fn(f64, f64) -> f64,
    exact: impl Fn(F, F) -> F,
) -> F {
    if F::WIDE_ACTIVATIONS {
        F::from_f64(wide(g.to_f64(), x.to_f64()))
    } else {
        exact(g, x)
    }
}

/// A float unary op on `src` through `layout`, written into `out` (`layout.numel()` elements).
pub fn unary_float<F: KernelFloat>(src: &[F], layout: &Layout, op: UnaryOp, out: &mut [F]) {
    let one = F::c(1.0);
    let half = F::c(0.5);
    let zero = F::c(0.0);
    match op {
        UnaryOp::Neg => map1_into(src, layout, out, |x: F| -x),
        UnaryOp::Exp => {
            map1_into_vectorised(src, layout, out, |x: F| activation(x, math::exp, F::exp))
        }
        UnaryOp::Log => map1_into(src, layout, out, |x: F| x.ln()),
        UnaryOp::Sqrt => map1_into(src, layout, out, |x: F| x.sqrt()),
        UnaryOp::Rsqrt => map1_into(src, layout, out, |x: F| one / x.sqrt()),
        UnaryOp::Abs => map1_into(src, layout, out, |x: F| x.abs()),
        // NaN stays NaN (`NaN <= 0` is false); written as one compare and select.
        UnaryOp::Relu => map1_into(src, layout, out, |x: F| if x <= zero { zero } else { x }),
        UnaryOp::GeluErf => map1_into(src, layout, out, |x: F| {
            half * x * (one + (x * F::c(std::f64::consts::FRAC_1_SQRT_2)).erf())
        }),
        UnaryOp::GeluTanh => map1_into_vectorised(src, layout, out, |x: F| {
            activation(x, math::gelu_tanh, |x| {
                let inner = F::c(SQRT_2_OVER_PI) * (x + F::c(GELU_TANH_COEF) * x * x * x);
                half * x * (one + inner.tanh())
            })
        }),
        UnaryOp::Sigmoid => map1_into_vectorised(src, layout, out, |x: F| {
            activation(x, |x| math::sigmoid(x).0, sigmoid)
        }),
        UnaryOp::Tanh => {
            map1_into_vectorised(src, layout, out, |x: F| activation(x, math::tanh, F::tanh))
        }
        UnaryOp::Silu => map1_into_vectorised(src, layout, out, |x: F| {
            activation(x, math::silu, |x| x * sigmoid(x))
        }),
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
fn nan_max<F: KernelFloat>(a: F, b: F) -> F {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

#[inline]
fn nan_min<F: KernelFloat>(a: F, b: F) -> F {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// Where a binary op's scalar function is applied: a trait with a generic method rather than a
/// closure, so each op's function stays a concrete, inlined type in the loop. The op tables
/// below ([`float_binary`], [`int_binary`]) are written once for both ways of applying them.
trait ApplyBinary<T>: Sized {
    fn apply(self, f: impl Fn(T, T) -> T + Sync);

    /// [`ApplyBinary::apply`] for a branch-free `f`, whose loop over dense operands pays to
    /// compile for this CPU's vector instructions (the widened 16-bit form does not).
    fn apply_vectorised(self, f: impl Fn(T, T) -> T + Sync) {
        self.apply(f)
    }
}

/// Into a new contiguous `out`.
struct IntoOut<'a, T> {
    a: (&'a [T], &'a Layout),
    b: (&'a [T], &'a Layout),
    out: &'a mut [T],
}

impl<T: Copy + Send + Sync> ApplyBinary<T> for IntoOut<'_, T> {
    fn apply(self, f: impl Fn(T, T) -> T + Sync) {
        map2(self.a, self.b, self.out, f)
    }

    fn apply_vectorised(self, f: impl Fn(T, T) -> T + Sync) {
        map2_vectorised(self.a, self.b, self.out, f)
    }
}

/// In place through the destination's layout, the right operand read through its own (of the
/// destination's shape).
struct InPlace<'a, T> {
    dst: (&'a mut [T], &'a Layout),
    b: (&'a [T], &'a Layout),
}

impl<T: Copy + Send + Sync> ApplyBinary<T> for InPlace<'_, T> {
    fn apply(self, f: impl Fn(T, T) -> T + Sync) {
        assign_through(self.dst, self.b, f)
    }

    fn apply_vectorised(self, f: impl Fn(T, T) -> T + Sync) {
        assign_through_vectorised(self.dst, self.b, f)
    }
}

/// In place over a 16-bit destination (`f16`/`bf16`): both operands widened to `f32`, the op
/// applied there and the result rounded once as `binary` rounds its `f32` result
/// (`Element::from_f64`), so the bits equal the out-of-place op's, with no widened copies.
struct InPlaceWidened<'a, H> {
    dst: (&'a mut [H], &'a Layout),
    b: (&'a [H], &'a Layout),
}

impl<H: Element> ApplyBinary<f32> for InPlaceWidened<'_, H> {
    fn apply(self, f: impl Fn(f32, f32) -> f32 + Sync) {
        let widen = |v: H| v.to_f64() as f32;
        assign_through(self.dst, self.b, |x: H, y: H| {
            H::from_f64(f64::from(f(widen(x), widen(y))))
        })
    }
}

/// The scalar function of a float binary op, applied by `to`.
fn float_binary<F: KernelFloat>(op: BinaryOp, to: impl ApplyBinary<F>) {
    let (zero, one, half) = (F::c(0.0), F::c(1.0), F::c(0.5));
    match op {
        BinaryOp::Add => to.apply(|x: F, y: F| x + y),
        BinaryOp::Sub => to.apply(|x: F, y: F| x - y),
        BinaryOp::Mul => to.apply(|x: F, y: F| x * y),
        BinaryOp::Div => to.apply(|x: F, y: F| x / y),
        BinaryOp::Pow => to.apply(|x: F, y: F| x.powf(y)),
        BinaryOp::Maximum => to.apply(nan_max),
        BinaryOp::Minimum => to.apply(nan_min),
        BinaryOp::ReluBackward => to.apply(|g: F, y: F| if y <= zero { zero } else { g }),
        BinaryOp::GeluErfBackward => to.apply(|g: F, x: F| {
            let cdf = half * (one + (x * F::c(std::f64::consts::FRAC_1_SQRT_2)).erf());
            let pdf = (-half * x * x).exp() * F::c(0.398_942_280_401_432_7);
            g * (cdf + x * pdf)
        }),
        BinaryOp::GeluTanhBackward => to.apply_vectorised(|g: F, x: F| {
            activation_backward((g, x), math::gelu_tanh_backward, |g, x| {
                let inner = F::c(SQRT_2_OVER_PI) * (x + F::c(GELU_TANH_COEF) * x * x * x);
                let t = inner.tanh();
                let dinner = F::c(SQRT_2_OVER_PI) * (one + F::c(3.0 * GELU_TANH_COEF) * x * x);
                g * (half * (one + t) + half * x * (one - t * t) * dinner)
            })
        }),
        BinaryOp::SiluBackward => to.apply_vectorised(|g: F, x: F| {
            activation_backward((g, x), math::silu_backward, |g, x| {
                let s = sigmoid(x);
                g * (s * (one + x * (one - s)))
            })
        }),
        BinaryOp::SigmoidBackward => to.apply(|g: F, y: F| g * (one - y) * y),
        BinaryOp::TanhBackward => to.apply(|g: F, y: F| g * (one - y * y)),
    }
}

/// The scalar function of an integer binary op, applied by `to`; `None` (nothing applied) for
/// `Pow` and the activation backwards. Division by zero gives 0 instead of a panic (PyTorch
/// raises).
fn int_binary(op: BinaryOp, to: impl ApplyBinary<i64>) -> Option<()> {
    match op {
        BinaryOp::Add => to.apply(|x: i64, y: i64| x.wrapping_add(y)),
        BinaryOp::Sub => to.apply(|x: i64, y: i64| x.wrapping_sub(y)),
        BinaryOp::Mul => to.apply(|x: i64, y: i64| x.wrapping_mul(y)),
        BinaryOp::Div => to.apply(|x: i64, y: i64| x.checked_div(y).unwrap_or(0)),
        BinaryOp::Maximum => to.apply(|x: i64, y: i64| x.max(y)),
        BinaryOp::Minimum => to.apply(|x: i64, y: i64| x.min(y)),
        BinaryOp::Pow
        | BinaryOp::ReluBackward
        | BinaryOp::GeluErfBackward
        | BinaryOp::GeluTanhBackward
        | BinaryOp::SiluBackward
        | BinaryOp::SigmoidBackward
        | BinaryOp::TanhBackward => return None,
    }
    Some(())
}

/// A float binary op, written into `out` (`la.numel()` elements).
pub fn binary_float<F: KernelFloat>(
    a: &[F],
    la: &Layout,
    b: &[F],
    lb: &Layout,
    op: BinaryOp,
    out: &mut [F],
) {
    float_binary(
        op,
        IntoOut {
            a: (a, la),
            b: (b, lb),
            out,
        },
    )
}

/// An integer binary op written into `out`; `None` (and `out` untouched) for `Pow` and the
/// activation backwards.
pub fn binary_int(
    a: &[i64],
    la: &Layout,
    b: &[i64],
    lb: &Layout,
    op: BinaryOp,
    out: &mut [i64],
) -> Option<()> {
    int_binary(
        op,
        IntoOut {
            a: (a, la),
            b: (b, lb),
            out,
        },
    )
}

/// `dst = op(dst, b)` in place for a float `dst` read and written through `ld`, `b` read
/// through `lb` (of `ld`'s shape).
pub fn binary_float_assign<F: KernelFloat>(
    dst: (&mut [F], &Layout),
    b: (&[F], &Layout),
    op: BinaryOp,
) {
    float_binary(op, InPlace { dst, b })
}

/// `dst = op(dst, b)` in place for an `f16`/`bf16` `dst` through its layout, computed in `f32`
/// and rounded as the out-of-place op rounds ([`InPlaceWidened`]).
fn binary_half_assign<H: Element>(dst: (&mut [H], &Layout), b: (&[H], &Layout), op: BinaryOp) {
    float_binary(op, InPlaceWidened { dst, b })
}

/// `dst = op(dst, b)` in place for an `i64` `dst` through its layout; `None` (and `dst`
/// untouched) where [`binary_int`] has no such op.
pub fn binary_int_assign(
    dst: (&mut [i64], &Layout),
    b: (&[i64], &Layout),
    op: BinaryOp,
) -> Option<()> {
    int_binary(op, InPlace { dst, b })
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

impl ElementwiseOps for CpuStorage {
    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self> {
        if let CpuStorage::I64(b) = self {
            let mut supported = false;
            let out = output::<i64>(layout.numel(), |out| {
                supported = unary_int(b.as_slice(), layout, op, out).is_some();
            })?;
            return match supported {
                true => Ok(out),
                false => Err(unsupported(op.name(), DType::I64, FLOAT_HINT)),
            };
        }
        float_op!(self, layout, op.name(), |s, l, out| unary_float(
            s, l, op, out
        ))
    }

    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self> {
        same_dtype(op.name(), self, rhs)?;
        let n = layout.numel();
        match (self, rhs) {
            (CpuStorage::I64(a), CpuStorage::I64(b)) => {
                let mut supported = false;
                let out = output::<i64>(n, |out| {
                    let (a, b) = (a.as_slice(), b.as_slice());
                    supported = binary_int(a, layout, b, rhs_layout, op, out).is_some();
                })?;
                match supported {
                    true => Ok(out),
                    false => Err(unsupported(op.name(), DType::I64, FLOAT_HINT)),
                }
            }
            _ => float_dispatch!(
                op.name(),
                self.dtype(),
                "convert with to_dtype(DType::F32) or to_dtype(DType::I64) first",
                (T, X) => {
                    let (a, la) = read_as::<T>(self, layout)?;
                    let (b, lb) = read_as::<T>(rhs, rhs_layout)?;
                    let computed = buffer_of::<T>(n, |out| binary_float(&a, &la, &b, &lb, op, out))?;
                    drop((a, b));
                    finish_cast::<T, X>(computed)
                }
            ),
        }
    }

    /// Contiguous destinations of every float dtype and `i64` are updated in place (`f16` and
    /// `bf16` computed in `f32` element by element, rounded as `binary` rounds). A strided
    /// destination goes through a contiguous result that is then copied in.
    fn binary_into(
        &self,
        layout: &Layout,
        dst: &mut Self,
        dst_layout: &Layout,
        op: BinaryOp,
    ) -> Result<()> {
        same_dtype(op.name(), dst, self)?;
        check_in_place(op.name(), (self, layout), (&*dst, dst_layout))?;
        let done = match (&mut *dst, self) {
            (CpuStorage::F32(d), CpuStorage::F32(b)) => {
                binary_float_assign((d.as_mut_slice(), dst_layout), (b.as_slice(), layout), op);
                true
            }
            (CpuStorage::F64(d), CpuStorage::F64(b)) => {
                binary_float_assign((d.as_mut_slice(), dst_layout), (b.as_slice(), layout), op);
                true
            }
            (CpuStorage::F16(d), CpuStorage::F16(b)) => {
                binary_half_assign((d.as_mut_slice(), dst_layout), (b.as_slice(), layout), op);
                true
            }
            (CpuStorage::BF16(d), CpuStorage::BF16(b)) => {
                binary_half_assign((d.as_mut_slice(), dst_layout), (b.as_slice(), layout), op);
                true
            }
            (CpuStorage::I64(d), CpuStorage::I64(b)) => {
                let d = (d.as_mut_slice(), dst_layout);
                if binary_int_assign(d, (b.as_slice(), layout), op).is_none() {
                    return Err(unsupported(op.name(), DType::I64, FLOAT_HINT));
                }
                true
            }
            _ => false,
        };
        if done {
            return Ok(());
        }
        let computed = dst.binary(dst_layout, self, layout, op)?;
        let whole = Layout::contiguous(dst_layout.shape());
        crate::ops::copy::CopyOps::copy_into(&computed, &whole, dst, dst_layout)
    }

    fn add_scaled_into(
        &self,
        layout: &Layout,
        dst: &mut Self,
        dst_layout: &Layout,
        alpha: f64,
    ) -> Result<()> {
        super::cpu_assign::add_scaled_into(self, layout, dst, dst_layout, alpha)
    }

    fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp) -> Result<Self> {
        same_dtype("comparison", self, rhs)?;
        let rhs_layout = (rhs, rhs_layout);
        with_slice!(self, a => output::<BoolByte>(layout.numel(), |out| {
            let (b, lb) = rhs_layout;
            let b = HostElement::slice(b).expect("dtypes checked equal above");
            compare(a, layout, b, lb, op, out)
        }))
    }

    fn where_cond(
        &self,
        layout: &Layout,
        on_true: &Self,
        true_layout: &Layout,
        on_false: &Self,
        false_layout: &Layout,
    ) -> Result<Self> {
        same_dtype("where", on_true, on_false)?;
        let cond = (as_condition(self, "where")?, layout);
        with_slice!(on_true, t => output(layout.numel(), |out| {
            let f = HostElement::slice(on_false).expect("dtypes checked equal above");
            where_cond(cond, (t, true_layout), (f, false_layout), out)
        }))
    }
}
