//! The GEMM arithmetic behind the emulated cuBLAS entry points: pure functions on host memory,
//! no handles, no streams. Invariants:
//! - Matrices are column-major, as cuBLAS's: element (row i, column j) of a matrix with leading
//!   dimension `ld` is at element offset `i + j * ld`; batch matrix `b` starts `b * stride`
//!   elements after the first (a stride may be 0 or negative).
//! - `C = alpha · op(A) · op(B) + beta · C`. When `beta == 0`, C is never read (a NaN in C does not
//!   leak into the result, as in cuBLAS); when `alpha == 0` or `k == 0`, A and B are never read.
//! - f32 accumulation for every compute type but 64F: 16-bit inputs widen exactly to f32; the fast
//!   compute types first round A and B to TF32 / f16 / bf16 (as tensor cores read them); the
//!   result is rounded once to C's type with round-to-nearest-even (the `half` crate).
//! - The caller guarantees every element the plan reaches is readable (and C writable).
//! - Products run on `gemm`'s f32 / f64 kernels (`gemm-f32`, `gemm-f64`) as `gemm::gemm` would
//!   call them: C is column-major (column stride `ld`, row stride 1), the layout `gemm::gemm`
//!   passes through untransposed, and every stride here is positive.

use gemm_common::Parallelism;
use half::{bf16, f16};

/// A matrix element type the emulator multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// IEEE binary16 (`CUDA_R_16F`).
    F16,
    /// bfloat16 (`CUDA_R_16BF`).
    BF16,
    /// IEEE binary32 (`CUDA_R_32F`).
    F32,
    /// IEEE binary64 (`CUDA_R_64F`).
    F64,
}

impl Elem {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Elem::F16 | Elem::BF16 => 2,
            Elem::F32 => 4,
            Elem::F64 => 8,
        }
    }
}

/// How A and B are rounded before they are multiplied (f32 accumulation only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputRounding {
    /// Used as they are (exactly widened to f32).
    Exact,
    /// Rounded to TF32: 10 explicit mantissa bits, round to nearest with ties away from zero
    /// (PTX `cvt.rna.tf32.f32`); infinities and NaNs pass unchanged.
    Tf32,
    /// Rounded to f16 (round to nearest even).
    F16,
    /// Rounded to bf16 (round to nearest even).
    Bf16,
}

/// What precision the products and sums are computed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulate {
    /// f32 (every compute type but 64F; 16F is emulated with f32 sums rounded once).
    F32,
    /// f64 (`CUBLAS_COMPUTE_64F`, f64 data only).
    F64,
}

/// One operand or the result of a (batched) GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matrix {
    /// Address of batch matrix 0, element (0, 0).
    pub addr: u64,
    /// Element type.
    pub elem: Elem,
    /// Leading dimension in elements.
    pub ld: usize,
    /// Elements from one batch matrix to the next.
    pub stride: i64,
}

/// A fully validated (batched) GEMM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmPlan {
    /// op(A) = Aᵀ (A stored k×m) instead of A (stored m×k).
    pub transpose_a: bool,
    /// op(B) = Bᵀ (B stored n×k) instead of B (stored k×n).
    pub transpose_b: bool,
    /// Rows of op(A) and C.
    pub m: usize,
    /// Columns of op(B) and C.
    pub n: usize,
    /// Columns of op(A), rows of op(B).
    pub k: usize,
    /// Number of matrices in the batch.
    pub batch: usize,
    /// Left operand.
    pub a: Matrix,
    /// Right operand.
    pub b: Matrix,
    /// Result (read only when `beta != 0`).
    pub c: Matrix,
    /// Scale of the product (already in the compute type's precision).
    pub alpha: f64,
    /// Scale of C's old value (already in the compute type's precision).
    pub beta: f64,
    /// Accumulation precision.
    pub accumulate: Accumulate,
    /// Rounding applied to A and B first.
    pub rounding: InputRounding,
}

/// Rounds an f32 to TF32 (see [`InputRounding::Tf32`]).
pub fn round_tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    // Adding half of the dropped range to the magnitude bits and truncating rounds to nearest,
    // ties away from zero; a carry into the exponent is the correct next binade (or infinity).
    let bits = x.to_bits();
    f32::from_bits((bits + 0x1000) & !0x1fff)
}

fn round_input(x: f32, rounding: InputRounding) -> f32 {
    match rounding {
        InputRounding::Exact => x,
        InputRounding::Tf32 => round_tf32(x),
        InputRounding::F16 => f16::from_f32(x).to_f32(),
        InputRounding::Bf16 => bf16::from_f32(x).to_f32(),
    }
}

/// # Safety
/// `addr + index * elem.size()` is readable.
unsafe fn load_f32(addr: u64, elem: Elem, index: isize) -> f32 {
    let at = (addr as isize + index * elem.size() as isize) as usize;
    // SAFETY: the caller guarantees the element is readable; unaligned reads are allowed.
    unsafe {
        match elem {
            Elem::F16 => f16::from_bits((at as *const u16).read_unaligned()).to_f32(),
            Elem::BF16 => bf16::from_bits((at as *const u16).read_unaligned()).to_f32(),
            Elem::F32 => (at as *const f32).read_unaligned(),
            Elem::F64 => (at as *const f64).read_unaligned() as f32,
        }
    }
}

/// # Safety
/// `addr + index * elem.size()` is writable.
unsafe fn store_f32(addr: u64, elem: Elem, index: isize, value: f32) {
    let at = (addr as isize + index * elem.size() as isize) as usize;
    // SAFETY: the caller guarantees the element is writable.
    unsafe {
        match elem {
            Elem::F16 => (at as *mut u16).write_unaligned(f16::from_f32(value).to_bits()),
            Elem::BF16 => (at as *mut u16).write_unaligned(bf16::from_f32(value).to_bits()),
            Elem::F32 => (at as *mut f32).write_unaligned(value),
            Elem::F64 => (at as *mut f64).write_unaligned(value as f64),
        }
    }
}

/// Products below this many multiply-adds run on the calling (stream worker) thread alone.
const PARALLEL_WORK: usize = 1 << 22;

fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    if m.saturating_mul(n).saturating_mul(k) >= PARALLEL_WORK {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// An f32 view of op(X) (`rows × cols`): a pointer with row and column strides in elements.
struct F32View {
    ptr: *const f32,
    row_stride: isize,
    col_stride: isize,
    _packed: Option<Vec<f32>>,
}

/// op(X) for matrix `x` at `base` (`rows × cols` after the op) as f32, packed (converted and
/// rounded) unless it is f32 used exactly.
///
/// # Safety
/// Every element of op(X) is readable.
unsafe fn f32_view(
    x: &Matrix,
    base: u64,
    transpose: bool,
    rows: usize,
    cols: usize,
    rounding: InputRounding,
) -> F32View {
    // Stored element (r, c) of op(X) sits at r*rs + c*cs.
    let (rs, cs) = if transpose {
        (x.ld as isize, 1)
    } else {
        (1, x.ld as isize)
    };
    if x.elem == Elem::F32 && rounding == InputRounding::Exact {
        return F32View {
            ptr: base as *const f32,
            row_stride: rs,
            col_stride: cs,
            _packed: None,
        };
    }
    let mut packed = Vec::with_capacity(rows * cols);
    for c in 0..cols {
        for r in 0..rows {
            // SAFETY: (r, c) is an element of op(X), readable by the caller's guarantee.
            let v = unsafe { load_f32(base, x.elem, r as isize * rs + c as isize * cs) };
            packed.push(round_input(v, rounding));
        }
    }
    F32View {
        ptr: packed.as_ptr(),
        row_stride: 1,
        col_stride: rows as isize,
        _packed: Some(packed),
    }
}

fn batch_addr(x: &Matrix, index: usize) -> u64 {
    (x.addr as i64).wrapping_add(x.stride.wrapping_mul(index as i64) * x.elem.size() as i64) as u64
}

/// Runs `plan` on host memory.
///
/// # Safety
/// For every batch matrix, every element of A and B that op(A) (m×k) and op(B) (k×n) reach is
/// readable, and every element of C (m×n) is writable (and readable when `beta != 0`); C overlaps
/// neither A nor B.
pub unsafe fn run(plan: &GemmPlan) {
    let GemmPlan { m, n, k, .. } = *plan;
    if m == 0 || n == 0 {
        return;
    }
    for index in 0..plan.batch {
        let (a, b, c) = (
            batch_addr(&plan.a, index),
            batch_addr(&plan.b, index),
            batch_addr(&plan.c, index),
        );
        // SAFETY: forwarded from the caller, batch by batch.
        unsafe {
            if plan.alpha == 0.0 || k == 0 {
                scale_c(plan, c);
            } else if plan.accumulate == Accumulate::F64 {
                gemm_f64(plan, a, b, c);
            } else {
                gemm_f32(plan, a, b, c);
            }
        }
    }
}

/// C = beta · C (zeros without reading C when beta is 0).
///
/// # Safety
/// As [`run`], for the batch matrix of C at `c`.
unsafe fn scale_c(plan: &GemmPlan, c: u64) {
    let ld = plan.c.ld as isize;
    for j in 0..plan.n as isize {
        for i in 0..plan.m as isize {
            let at = i + j * ld;
            // SAFETY: (i, j) is an element of C.
            unsafe {
                if plan.c.elem == Elem::F64 {
                    let p = (c as *mut f64).offset(at);
                    let old = if plan.beta == 0.0 { 0.0 } else { p.read() };
                    p.write(if plan.beta == 0.0 {
                        0.0
                    } else {
                        plan.beta * old
                    });
                } else {
                    let value = if plan.beta == 0.0 {
                        0.0
                    } else {
                        plan.beta as f32 * load_f32(c, plan.c.elem, at)
                    };
                    store_f32(c, plan.c.elem, at, value);
                }
            }
        }
    }
}

/// # Safety
/// As [`run`]; all three matrices are f64.
unsafe fn gemm_f64(plan: &GemmPlan, a: u64, b: u64, c: u64) {
    let (ars, acs) = strides(plan.transpose_a, plan.a.ld);
    let (brs, bcs) = strides(plan.transpose_b, plan.b.ld);
    // SAFETY: the strides address exactly op(A), op(B) and C, which the caller guarantees.
    unsafe {
        gemm_f64::gemm::f64::get_gemm_fn()(
            plan.m,
            plan.n,
            plan.k,
            c as *mut f64,
            plan.c.ld as isize,
            1,
            plan.beta != 0.0,
            a as *const f64,
            acs,
            ars,
            b as *const f64,
            bcs,
            brs,
            plan.beta,
            plan.alpha,
            false,
            false,
            false,
            parallelism(plan.m, plan.n, plan.k),
        );
    }
}

/// (row stride, column stride) of op(X) in the stored column-major X.
fn strides(transpose: bool, ld: usize) -> (isize, isize) {
    if transpose {
        (ld as isize, 1)
    } else {
        (1, ld as isize)
    }
}

/// # Safety
/// As [`run`].
unsafe fn gemm_f32(plan: &GemmPlan, a: u64, b: u64, c: u64) {
    let GemmPlan { m, n, k, .. } = *plan;
    // SAFETY: op(A) is m×k and op(B) k×n, readable by the caller's guarantee.
    let (va, vb) = unsafe {
        (
            f32_view(&plan.a, a, plan.transpose_a, m, k, plan.rounding),
            f32_view(&plan.b, b, plan.transpose_b, k, n, plan.rounding),
        )
    };
    let (alpha, beta) = (plan.alpha as f32, plan.beta as f32);
    let par = parallelism(m, n, k);
    if plan.c.elem == Elem::F32 {
        // SAFETY: C is m×n f32 with leading dimension ld, writable (readable when beta != 0).
        unsafe {
            gemm_f32::gemm::f32::get_gemm_fn()(
                m,
                n,
                k,
                c as *mut f32,
                plan.c.ld as isize,
                1,
                beta != 0.0,
                va.ptr,
                va.col_stride,
                va.row_stride,
                vb.ptr,
                vb.col_stride,
                vb.row_stride,
                beta,
                alpha,
                false,
                false,
                false,
                par,
            );
        }
        return;
    }
    let mut product = vec![0f32; m * n];
    // SAFETY: `product` is m×n column-major; the views are valid for the call.
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            m,
            n,
            k,
            product.as_mut_ptr(),
            m as isize,
            1,
            false,
            va.ptr,
            va.col_stride,
            va.row_stride,
            vb.ptr,
            vb.col_stride,
            vb.row_stride,
            0.0,
            alpha,
            false,
            false,
            false,
            par,
        );
    }
    let ld = plan.c.ld as isize;
    for j in 0..n {
        for i in 0..m {
            let at = i as isize + j as isize * ld;
            let mut value = product[i + j * m];
            if beta != 0.0 {
                // SAFETY: (i, j) is an element of C, readable when beta != 0.
                value += beta * unsafe { load_f32(c, plan.c.elem, at) };
            }
            // SAFETY: (i, j) is an element of C.
            unsafe { store_f32(c, plan.c.elem, at, value) };
        }
    }
}
