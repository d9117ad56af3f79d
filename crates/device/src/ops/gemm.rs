//! The CPU's matrix products: `gemm`'s `f32` and `f64` kernels (`gemm-f32`, `gemm-f64`),
//! called without the `gemm` front crate, which also builds complex and `f16` kernels kiln
//! never runs.
//!
//! Invariants: [`gemm`] computes what `gemm::gemm` computes and takes its arguments, less the
//! three conjugation flags (always off for real numbers). It hands the kernel the same problem:
//! a destination stored by rows (column stride smaller than row stride) is computed as its
//! transpose, `dst^T = rhs^T lhs^T`, since the kernels prefer contiguous destination columns.
//! Strides are never negative (kiln's layouts have none), so the front crate's handling of
//! reversed strides is not needed.

pub(crate) use gemm_common::Parallelism;

/// A `gemm` kernel: `(m, n, k, dst, dst_cs, dst_rs, read_dst, lhs, lhs_cs, lhs_rs, rhs,
/// rhs_cs, rhs_rs, alpha, beta, conj_dst, conj_lhs, conj_rhs, parallelism)`.
type Kernel<T> = unsafe fn(
    usize,
    usize,
    usize,
    *mut T,
    isize,
    isize,
    bool,
    *const T,
    isize,
    isize,
    *const T,
    isize,
    isize,
    T,
    T,
    bool,
    bool,
    bool,
    Parallelism,
);

/// An element type with a `gemm` kernel: `f32` or `f64`.
pub trait GemmFloat: Copy + 'static {
    /// The kernel for this machine (chosen once, at the first call, by `gemm`).
    #[doc(hidden)]
    fn kernel() -> Kernel<Self>;
}

impl GemmFloat for f32 {
    fn kernel() -> Kernel<f32> {
        gemm_f32::gemm::f32::get_gemm_fn()
    }
}

impl GemmFloat for f64 {
    fn kernel() -> Kernel<f64> {
        gemm_f64::gemm::f64::get_gemm_fn()
    }
}

/// `dst = alpha * dst + beta * lhs @ rhs` (`alpha * dst` only when `read_dst`), `dst` being
/// `m x n`, `lhs` `m x k` and `rhs` `k x n`, each addressed by a column and a row stride.
///
/// # Safety
/// Every element the strides address lies in its allocation, the strides are not negative,
/// and `dst` overlaps neither `lhs` nor `rhs`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<T: GemmFloat>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    dst_cs: isize,
    dst_rs: isize,
    read_dst: bool,
    lhs: *const T,
    lhs_cs: isize,
    lhs_rs: isize,
    rhs: *const T,
    rhs_cs: isize,
    rhs_rs: isize,
    alpha: T,
    beta: T,
    parallelism: Parallelism,
) {
    debug_assert!([dst_cs, dst_rs, lhs_cs, lhs_rs, rhs_cs, rhs_rs]
        .iter()
        .all(|&s| s >= 0));
    // A destination stored by rows is computed as its transpose: swap the sizes, the
    // destination's strides, and the operands with their strides swapped.
    let (m, n, dst_cs, dst_rs, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs) = if dst_cs < dst_rs {
        (
            n, m, dst_rs, dst_cs, rhs, rhs_rs, rhs_cs, lhs, lhs_rs, lhs_cs,
        )
    } else {
        (
            m, n, dst_cs, dst_rs, lhs, lhs_cs, lhs_rs, rhs, rhs_cs, rhs_rs,
        )
    };
    // SAFETY: the caller's guarantees, for the product or (same elements) its transpose.
    unsafe {
        T::kernel()(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            read_dst,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            alpha,
            beta,
            false,
            false,
            false,
            parallelism,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `3 * dst + 2 * lhs @ rhs` into a destination stored by rows (the transposed call) and
    /// one stored by columns (the direct call), against a triple loop. Which call a layout
    /// takes is a matter of speed only: both give the same product.
    fn both_layouts<T: GemmFloat + Into<f64> + From<u8>>() {
        let (m, n, k) = (7, 5, 9);
        let lhs: Vec<T> = (0..m * k).map(|v| T::from((v % 11) as u8)).collect();
        let rhs: Vec<T> = (0..k * n).map(|v| T::from((v % 13) as u8)).collect();
        let want = |i: usize, j: usize| -> f64 {
            (0..k)
                .map(|t| lhs[i * k + t].into() * rhs[t * n + j].into())
                .sum()
        };
        for by_rows in [true, false] {
            let (cs, rs) = if by_rows { (1, n) } else { (m, 1) };
            let mut dst = vec![T::from(1); m * n];
            // SAFETY: every (i, j) at i * rs + j * cs lies in the m * n elements of `dst`;
            // lhs and rhs are row-major with their shapes.
            unsafe {
                gemm(
                    m,
                    n,
                    k,
                    dst.as_mut_ptr(),
                    cs as isize,
                    rs as isize,
                    true,
                    lhs.as_ptr(),
                    1,
                    k as isize,
                    rhs.as_ptr(),
                    1,
                    n as isize,
                    T::from(3),
                    T::from(2),
                    Parallelism::None,
                );
            }
            for i in 0..m {
                for j in 0..n {
                    // 3 * dst (all ones) + 2 * (lhs @ rhs)
                    let got: f64 = dst[i * rs + j * cs].into();
                    assert_eq!(got, 3.0 + 2.0 * want(i, j), "({i}, {j}), by rows {by_rows}");
                }
            }
        }
    }

    #[test]
    fn a_destination_by_rows_or_by_columns_gets_the_same_product() {
        both_layouts::<f32>();
        both_layouts::<f64>();
    }
}
