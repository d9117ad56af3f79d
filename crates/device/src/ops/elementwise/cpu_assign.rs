//! CPU in-place updates through the destination's layout: the element walk every in-place
//! arithmetic op uses ([`assign_through`]), the fused `dst += alpha * b` of `add_scaled_into`,
//! and the check both make of their views.
//!
//! Invariants: a contiguous destination is split into parallel chunks, each element read and
//! written by one chunk; any other view is walked in one sequential pass (its elements need not
//! form disjoint chunks of memory), so nothing is allocated either way; the fused update rounds
//! exactly once per element on every instruction set (`mul_add`), f16/bf16 in f32 with `alpha`
//! rounded to their dtype first.

use crate::dtype::Element;
use crate::layout::Layout;
use crate::ops::cpu_dispatch::{same_dtype, unsupported, FLOAT_HINT};
use crate::ops::simd::{simd_dispatch, Isa};
use crate::ops::strided::{fill_chunks, map2_assign};
use crate::ops::KernelFloat;
use crate::{CpuStorage, Result};

/// `dst += alpha * b` in place (see `ElementwiseOps::add_scaled_into`).
pub(super) fn add_scaled_into(
    b: &CpuStorage,
    layout: &Layout,
    dst: &mut CpuStorage,
    dst_layout: &Layout,
    alpha: f64,
) -> Result<()> {
    const OP: &str = "add_";
    same_dtype(OP, dst, b)?;
    check_in_place(OP, (b, layout), (&*dst, dst_layout))?;
    let isa = crate::ops::simd::isa();
    let a = super::add_scaled_alpha_f32(dst.dtype(), alpha);
    match (&mut *dst, b) {
        (CpuStorage::F32(d), CpuStorage::F32(s)) => fma_assign(
            isa,
            (d.as_mut_slice(), dst_layout),
            (s.as_slice(), layout),
            a,
        ),
        (CpuStorage::F64(d), CpuStorage::F64(s)) => fma_assign(
            isa,
            (d.as_mut_slice(), dst_layout),
            (s.as_slice(), layout),
            alpha,
        ),
        (CpuStorage::F16(d), CpuStorage::F16(s)) => fma_assign_half(
            isa,
            (d.as_mut_slice(), dst_layout),
            (s.as_slice(), layout),
            a,
        ),
        (CpuStorage::BF16(d), CpuStorage::BF16(s)) => fma_assign_half(
            isa,
            (d.as_mut_slice(), dst_layout),
            (s.as_slice(), layout),
            a,
        ),
        (other, _) => return Err(unsupported(OP, other.dtype(), FLOAT_HINT)),
    }
    Ok(())
}

/// `dst[i] = f(dst[i], b[j])` over the elements of `dst`'s layout: a contiguous range in
/// parallel chunks ([`map2_assign`]), any other view in one sequential pass (no temporary; a
/// view's elements need not be disjoint chunks of memory, so it is not split across threads).
pub(super) fn assign_through<T: Copy + Send + Sync, B: Copy + Sync>(
    (dst, ld): (&mut [T], &Layout),
    (b, lb): (&[B], &Layout),
    f: impl Fn(T, B) -> T + Sync,
) {
    match ld.contiguous_offset() {
        Some(start) => map2_assign(&mut dst[start..start + ld.numel()], (b, lb), f),
        None => {
            for (i, j) in ld.offsets().zip(lb.offsets()) {
                dst[i] = f(dst[i], b[j]);
            }
        }
    }
}

/// [`assign_through`] for a branch-free `f` (`activation_math`'s backwards): two dense operands'
/// loop is compiled for this CPU's vector instructions.
pub(super) fn assign_through_vectorised<T: Copy + Send + Sync>(
    dst: (&mut [T], &Layout),
    b: (&[T], &Layout),
    f: impl Fn(T, T) -> T + Sync,
) {
    let isa = crate::ops::simd::isa();
    chunked_or_walked(dst, b, |out, b| dense_assign(isa, out, b, &f), &f)
}

simd_dispatch! {
    /// `dst[i] = f(dst[i], b[i])` over two slices of one length.
    fn dense_assign[T: Copy, F: Fn(T, T) -> T](dst: &mut [T], b: &[T], f: &F)
        => dense_assign_body[T, F];
}

#[inline(always)]
fn dense_assign_body<T: Copy, F: Fn(T, T) -> T>(dst: &mut [T], b: &[T], f: &F) {
    for (o, &y) in dst.iter_mut().zip(b) {
        *o = f(*o, y);
    }
}

/// `dst[i] = elem(dst[i], b[j])` through both layouts: contiguous operands in parallel chunks,
/// each handed whole to `chunk` (a loop compiled for the CPU's vector instructions), other views
/// through [`assign_through`]. `chunk` and `elem` must compute the same function.
fn chunked_or_walked<T: Copy + Send + Sync>(
    dst: (&mut [T], &Layout),
    (b, lb): (&[T], &Layout),
    chunk: impl Fn(&mut [T], &[T]) + Sync,
    elem: impl Fn(T, T) -> T + Sync,
) {
    match (dst.1.contiguous_offset(), lb.contiguous_offset()) {
        (Some(d0), Some(b0)) => {
            let n = dst.1.numel();
            let b = &b[b0..b0 + n];
            fill_chunks(&mut dst.0[d0..d0 + n], |start, out| {
                chunk(out, &b[start..start + out.len()])
            })
        }
        _ => assign_through(dst, (b, lb), elem),
    }
}

/// `dst += alpha * b` rounded once, through both layouts ([`fma_chunk`] on contiguous chunks).
fn fma_assign<F: KernelFloat>(
    isa: Option<Isa>,
    dst: (&mut [F], &Layout),
    b: (&[F], &Layout),
    alpha: F,
) {
    chunked_or_walked(
        dst,
        b,
        |out, b| fma_chunk(isa, out, b, alpha),
        |x, y| y.mul_add(alpha, x),
    )
}

/// [`fma_assign`] for f16/bf16: widened to f32, fused there with `alpha` (already rounded to
/// the dtype, [`super::add_scaled_alpha_f32`]), rounded once.
fn fma_assign_half<H: Element>(
    isa: Option<Isa>,
    dst: (&mut [H], &Layout),
    b: (&[H], &Layout),
    alpha: f32,
) {
    chunked_or_walked(
        dst,
        b,
        |out, b| fma_chunk_half(isa, out, b, alpha),
        |x, y| fma_half(x, y, alpha),
    )
}

/// `x + alpha * y` of two 16-bit values, in f32, rounded once.
#[inline(always)]
fn fma_half<H: Element>(x: H, y: H, alpha: f32) -> H {
    let widen = |v: H| v.to_f64() as f32;
    H::from_f64(f64::from(widen(y).mul_add(alpha, widen(x))))
}

#[inline(always)]
fn fma_chunk_body<F: KernelFloat>(dst: &mut [F], b: &[F], alpha: F) {
    for (d, &y) in dst.iter_mut().zip(b) {
        *d = y.mul_add(alpha, *d);
    }
}

#[inline(always)]
fn fma_chunk_half_body<H: Element>(dst: &mut [H], b: &[H], alpha: f32) {
    for (d, &y) in dst.iter_mut().zip(b) {
        *d = fma_half(*d, y, alpha);
    }
}

simd_dispatch! {
    /// `dst[i] += alpha * b[i]`, one rounding, compiled for `isa` (an FMA instruction there; the
    /// portable build calls libm's `fma`, which rounds the same way).
    fn fma_chunk[F: KernelFloat](dst: &mut [F], b: &[F], alpha: F) => fma_chunk_body[F];
}

simd_dispatch! {
    /// [`fma_chunk`] for f16/bf16 (computed in f32).
    fn fma_chunk_half[H: Element](dst: &mut [H], b: &[H], alpha: f32) => fma_chunk_half_body[H];
}

/// The in-place operands' layouts have one shape and stay inside their buffers (the seam's
/// callers build them so; a bad call is an error here, not an index panic mid-update).
pub(super) fn check_in_place(
    op: &'static str,
    (b, lb): (&CpuStorage, &Layout),
    (dst, ld): (&CpuStorage, &Layout),
) -> Result<()> {
    if lb.shape() != ld.shape() || lb.required_len() > b.len() || ld.required_len() > dst.len() {
        return Err(crate::Error::LengthMismatch {
            op,
            what: format!(
                "in place: a source view of shape {:?} reaching element {} of {} into a \
                 destination view of shape {:?} reaching element {} of {}",
                lb.shape(),
                lb.required_len(),
                b.len(),
                ld.shape(),
                ld.required_len(),
                dst.len()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::elementwise::{BinaryOp, ElementwiseOps};
    use crate::testing::cpu_values;
    use crate::DType;

    #[test]
    fn in_place_views_that_do_not_fit_are_errors_not_panics() {
        let b = cpu_values(vec![1.0; 6], DType::F32).unwrap();
        let mut dst = cpu_values(vec![2.0; 6], DType::F32).unwrap();
        let fits = Layout::contiguous(&[2, 3]);
        // A destination view past the buffer's end, a source past its end, unequal shapes.
        let past_end = Layout::new(vec![2, 3], vec![4, 1], 0);
        let other_shape = Layout::contiguous(&[3, 2]);
        for (src, dst_l) in [
            (&fits, &past_end),
            (&past_end, &fits),
            (&other_shape, &fits),
        ] {
            let e = b
                .binary_into(src, &mut dst, dst_l, BinaryOp::Add)
                .unwrap_err();
            assert!(e.to_string().contains("in place"), "{e}");
        }
        assert_eq!(dst.to_f64_vec(), vec![2.0; 6], "nothing was written");
        // A transposed destination in bounds is updated through its layout.
        let t = Layout::contiguous(&[3, 2]).transpose(0, 1);
        let row = Layout::new(vec![2, 3], vec![0, 1], 0);
        let src = cpu_values(vec![10.0, 20.0, 30.0, 0.0, 0.0, 0.0], DType::F32).unwrap();
        src.binary_into(&row, &mut dst, &t, BinaryOp::Add).unwrap();
        assert_eq!(dst.to_f64_vec(), vec![12.0, 12.0, 22.0, 22.0, 32.0, 32.0]);
    }

    #[test]
    fn the_fused_update_rounds_once_on_every_instruction_set() {
        // Values where x + round(alpha * y) and the fused x + alpha * y differ.
        let n = 1000;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() * 5.0).collect();
        let alpha = 0.1f32;
        let want: Vec<f32> = x
            .iter()
            .zip(&y)
            .map(|(&x, &y)| y.mul_add(alpha, x))
            .collect();
        let unfused = x
            .iter()
            .zip(&y)
            .zip(&want)
            .filter(|((&x, &y), &w)| x + alpha * y != w);
        assert!(unfused.count() > 0, "the data tells fused from unfused");
        let mut isas: Vec<Option<Isa>> = crate::ops::simd::available()
            .into_iter()
            .map(Some)
            .collect();
        isas.push(None);
        for isa in isas {
            let mut got = x.clone();
            fma_chunk(isa, &mut got, &y, alpha);
            assert_eq!(got, want, "{isa:?}");
            let (xh, yh): (Vec<half::bf16>, Vec<half::bf16>) = (
                x.iter().map(|&v| half::bf16::from_f32(v)).collect(),
                y.iter().map(|&v| half::bf16::from_f32(v)).collect(),
            );
            let mut goth = xh.clone();
            fma_chunk_half(isa, &mut goth, &yh, alpha);
            for ((g, &a), &b) in goth.iter().zip(&xh).zip(&yh) {
                let w = half::bf16::from_f32(b.to_f32().mul_add(alpha, a.to_f32()));
                assert_eq!(g.to_bits(), w.to_bits(), "{isa:?} bf16");
            }
        }
    }

    #[test]
    fn a_parallel_fused_update_pairs_every_element_with_its_own_operand() {
        // Contiguous views at different offsets, long enough to be split into parallel chunks.
        let n = 50_001;
        assert!(n > crate::threads::PARALLEL_THRESHOLD);
        let x: Vec<f32> = (0..n + 3).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let y: Vec<f32> = (0..n + 5).map(|i| (i as f32 * 0.11).cos() * 5.0).collect();
        let wide = |v: &[f32]| v.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
        let mut dst = cpu_values(wide(&x), DType::F32).unwrap();
        let src = cpu_values(wide(&y), DType::F32).unwrap();
        let (lx, ly) = (
            Layout::new(vec![n], vec![1], 3),
            Layout::new(vec![n], vec![1], 5),
        );
        add_scaled_into(&src, &ly, &mut dst, &lx, 0.1).unwrap();
        let got = dst.to_f64_vec();
        for (i, &g) in got.iter().enumerate() {
            let want = match i {
                0..3 => x[i],
                _ => y[i + 2].mul_add(0.1, x[i]),
            };
            assert_eq!(g, f64::from(want), "element {i}");
        }
    }
}
