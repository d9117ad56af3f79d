//! CPU batched matmul over `gemm`.
//!
//! For `[..batch, m, k] @ [..batch, k, n]` each batch matrix's start offset comes from the batch
//! part of the layout (so broadcast batch dims with stride 0 re-read the same matrix), and the row
//! and column strides go to `gemm` unchanged. Large products run one after another with `gemm`'s
//! own rayon parallelism; many small ones run in parallel across batch entries instead.

use super::MatmulOps;
use crate::layout::{Layout, StridedIndex};
use crate::ops::cpu_dispatch::{
    buffer_of, finish_cast, float_dispatch, read_as, same_dtype, FLOAT_HINT,
};
use crate::ops::gemm::Parallelism;
use crate::ops::KernelFloat;
use crate::threads::num_threads;
use crate::{CpuStorage, Error, Result};

struct SendPtr<T>(*const T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

/// Matrix dims and per-batch start offsets of both operands.
fn plan(la: &Layout, lb: &Layout) -> (usize, usize, usize, Vec<usize>, Vec<usize>) {
    let r = la.rank();
    let (m, k, n) = (la.shape()[r - 2], la.shape()[r - 1], lb.shape()[r - 1]);
    let batch_a = Layout::new(
        la.shape()[..r - 2].to_vec(),
        la.strides()[..r - 2].to_vec(),
        la.offset(),
    );
    let batch_b = Layout::new(
        lb.shape()[..r - 2].to_vec(),
        lb.strides()[..r - 2].to_vec(),
        lb.offset(),
    );
    (
        m,
        k,
        n,
        StridedIndex::new(&batch_a, 0).collect(),
        StridedIndex::new(&batch_b, 0).collect(),
    )
}

/// Elements of `a @ b` for `a`, `b` of (batch-broadcast) layouts `la`, `lb`:
/// `batch · m · n`.
pub fn output_len(la: &Layout, lb: &Layout) -> usize {
    let r = la.rank();
    la.shape()[..r - 2].iter().product::<usize>() * la.shape()[r - 2] * lb.shape()[r - 1]
}

/// `a @ b` with batch dims as a new `Vec` (the allocating form of [`matmul_into`]).
pub fn matmul<T: KernelFloat>(a: &[T], la: &Layout, b: &[T], lb: &Layout) -> Vec<T> {
    let mut out = vec![T::zero(); output_len(la, lb)];
    matmul_into(a, la, b, lb, &mut out);
    out
}

/// `a @ b` with batch dims, written contiguously (`[..batch, m, n]`) into `out`, which holds
/// [`output_len`] elements. Every element is overwritten (zero when `k == 0`).
pub fn matmul_into<T: KernelFloat>(a: &[T], la: &Layout, b: &[T], lb: &Layout, out: &mut [T]) {
    let r = la.rank();
    let (m, k, n, offs_a, offs_b) = plan(la, lb);
    assert_eq!(out.len(), offs_a.len() * m * n, "matmul output length");
    if m == 0 || n == 0 || k == 0 {
        out.fill(T::zero());
        return;
    }
    let (a_rs, a_cs) = (la.strides()[r - 2] as isize, la.strides()[r - 1] as isize);
    let (b_rs, b_cs) = (lb.strides()[r - 2] as isize, lb.strides()[r - 1] as isize);
    let (pa, pb) = (SendPtr(a.as_ptr()), SendPtr(b.as_ptr()));
    let one_matrix = |dst: &mut [T], oa: usize, ob: usize, par: Parallelism| {
        let (pa, pb) = (&pa, &pb);
        // SAFETY: `oa`/`ob` plus the largest (row, col) stride offsets stay inside `a`/`b` because
        // the layouts were built over these buffers (checked by the caller's `required_len`), and
        // `dst` holds exactly m*n elements written with row stride n, column stride 1.
        unsafe {
            crate::ops::gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                pa.0.add(oa),
                a_cs,
                a_rs,
                pb.0.add(ob),
                b_cs,
                b_rs,
                T::zero(),
                T::ONE,
                par,
            );
        }
    };
    let batches = offs_a.len();
    let big = m * n * k >= 64 * 64 * 64;
    crate::threads::install(|| {
        if batches == 1 || big {
            let par = if big {
                Parallelism::Rayon(num_threads())
            } else {
                Parallelism::None
            };
            for (i, dst) in out.chunks_mut(m * n).enumerate() {
                one_matrix(dst, offs_a[i], offs_b[i], par);
            }
        } else {
            crate::ops::par::chunks_mut(out, m * n, &|i, dst| {
                one_matrix(dst, offs_a[i], offs_b[i], Parallelism::None)
            });
        }
    });
}

/// The plain triple loop, for tests and as the benchmark's reference.
pub fn matmul_reference<T: KernelFloat>(a: &[T], la: &Layout, b: &[T], lb: &Layout) -> Vec<T> {
    let r = la.rank();
    let (m, k, n, offs_a, offs_b) = plan(la, lb);
    let (a_rs, a_cs) = (la.strides()[r - 2], la.strides()[r - 1]);
    let (b_rs, b_cs) = (lb.strides()[r - 2], lb.strides()[r - 1]);
    let mut out = vec![T::zero(); offs_a.len() * m * n];
    for (bi, dst) in out.chunks_mut(m * n.max(1)).enumerate() {
        for i in 0..m {
            for j in 0..n {
                let mut acc = T::zero();
                for p in 0..k {
                    acc +=
                        a[offs_a[bi] + i * a_rs + p * a_cs] * b[offs_b[bi] + p * b_rs + j * b_cs];
                }
                dst[i * n + j] = acc;
            }
        }
    }
    out
}

impl MatmulOps for CpuStorage {
    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self> {
        same_dtype("matmul", self, rhs)?;
        let r = layout.rank();
        let (sa, sb) = (layout.shape(), rhs_layout.shape());
        if r < 2 || rhs_layout.rank() != r {
            return Err(Error::LengthMismatch {
                op: "matmul",
                what: format!("shapes {sa:?} and {sb:?} are not [..b, m, k] and [..b, k, n]"),
            });
        }
        // `[2^32, 0] @ [0, 2^32]` is two empty operands but a 2^64-element output.
        let mut factors = sa[..r - 2].to_vec();
        factors.extend([sa[r - 2], sb[r - 1]]);
        let n = crate::checked_size("matmul", "the output's element count", &factors)?;
        float_dispatch!("matmul", self.dtype(), FLOAT_HINT, (T, X) => {
            let (a, la) = read_as::<T>(self, layout)?;
            let (b, lb) = read_as::<T>(rhs, rhs_layout)?;
            let computed = buffer_of::<T>(n, |out| matmul_into(&a, &la, &b, &lb, out))?;
            drop((a, b));
            finish_cast::<T, X>(computed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_matches_the_triple_loop_on_transposed_and_broadcast_inputs() {
        let a: Vec<f64> = (0..2 * 5 * 7).map(|v| (v as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..7 * 3).map(|v| (v as f64 * 0.11).cos()).collect();
        let la = Layout::contiguous(&[2, 5, 7]);
        // b is stored as [3, 7] and used transposed, broadcast over the batch.
        let lb = Layout::contiguous(&[3, 7])
            .transpose(0, 1)
            .unsqueeze(0)
            .broadcast_to(&[2, 7, 3]);
        let fast = matmul(&a, &la, &b, &lb);
        let slow = matmul_reference(&a, &la, &b, &lb);
        assert_eq!(fast.len(), 30);
        for (x, y) in fast.iter().zip(&slow) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
        let big: Vec<f32> = (0..96 * 96).map(|v| (v % 7) as f32).collect();
        let l = Layout::contiguous(&[96, 96]);
        let f = matmul(&big, &l, &big, &l);
        let s = matmul_reference(&big, &l, &big, &l);
        assert_eq!(f, s);
    }

    /// The kernel family gemm dispatches to here.
    fn gemm_path() -> &'static str {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return "AVX-512 (x86-v4)";
            }
            if std::arch::is_x86_feature_detected!("fma") {
                return "AVX2/FMA";
            }
        }
        "portable"
    }

    /// Issue 16: gemm 0.19 picks its AVX-512 kernels at run time where the CPU has them and
    /// its AVX2/FMA ones elsewhere; whichever this machine runs, odd sizes (edges of every
    /// micro-kernel tile), a transposed left operand and a right operand read through a
    /// narrowed (row-padded) view must equal the triple loop, in f32 and f64, single-threaded
    /// and split over the pool.
    #[test]
    fn gemm_matches_the_triple_loop_on_odd_sizes_and_strided_views() {
        eprintln!("gemm path on this CPU: {}", gemm_path());
        for &(m, n, k) in &[
            (1, 1, 1),
            (17, 33, 9),
            (31, 129, 65),
            (48, 65, 255),
            (127, 63, 300),
        ] {
            // a: stored [k, m], used transposed; b: rows of n + 5 elements, narrowed to n.
            let a: Vec<f64> = (0..k * m)
                .map(|v| ((v * 37 % 101) as f64) * 0.01 - 0.5)
                .collect();
            let b: Vec<f64> = (0..k * (n + 5))
                .map(|v| ((v * 53 % 97) as f64) * 0.02 - 1.0)
                .collect();
            let la = Layout::contiguous(&[k, m]).transpose(0, 1);
            let lb = Layout::contiguous(&[k, n + 5]).narrow(1, 2, n);
            let slow = matmul_reference(&a, &la, &b, &lb);
            let fast = matmul(&a, &la, &b, &lb);
            assert_eq!(fast.len(), m * n);
            for (i, (x, y)) in fast.iter().zip(&slow).enumerate() {
                assert!(
                    (x - y).abs() < 1e-9 * (1.0 + y.abs()),
                    "f64 {m}x{n}x{k} [{i}]: {x} vs {y}"
                );
            }
            let (a32, b32): (Vec<f32>, Vec<f32>) = (
                a.iter().map(|&v| v as f32).collect(),
                b.iter().map(|&v| v as f32).collect(),
            );
            let slow = matmul_reference(&a32, &la, &b32, &lb);
            let fast = matmul(&a32, &la, &b32, &lb);
            for (i, (x, y)) in fast.iter().zip(&slow).enumerate() {
                let tol = 1e-5 * (k as f32).sqrt() * (1.0 + y.abs());
                assert!((x - y).abs() < tol, "f32 {m}x{n}x{k} [{i}]: {x} vs {y}");
            }
        }
    }

    /// Batches of products run one after the other when each is large enough for `gemm` to
    /// split (64³ multiply-adds or more), else one product per pool task; either way batch
    /// `i` reads its own operands.
    #[test]
    fn every_batch_of_a_batched_product_reads_its_own_operands() {
        for (batches, m, n, k) in [(3, 65, 66, 67), (5, 9, 7, 11)] {
            let big = m * n * k >= 64 * 64 * 64;
            assert_eq!(big, batches == 3, "one case per path");
            let a: Vec<f64> = (0..batches * m * k)
                .map(|v| ((v * 37 % 101) as f64) * 0.01)
                .collect();
            let b: Vec<f64> = (0..batches * k * n)
                .map(|v| ((v * 53 % 97) as f64) * 0.02)
                .collect();
            let (la, lb) = (
                Layout::contiguous(&[batches, m, k]),
                Layout::contiguous(&[batches, k, n]),
            );
            let fast = matmul(&a, &la, &b, &lb);
            let slow = matmul_reference(&a, &la, &b, &lb);
            for (i, (x, y)) in fast.iter().zip(&slow).enumerate() {
                assert!(
                    (x - y).abs() < 1e-9 * (1.0 + y.abs()),
                    "{batches} batches [{i}]: {x} vs {y}"
                );
            }
        }
    }
}
