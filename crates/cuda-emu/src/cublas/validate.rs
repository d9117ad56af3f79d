//! Argument validation for the GEMM entry points, in cuBLAS's order and with its status codes,
//! and the byte ranges each matrix reaches. Invariants: nothing here touches memory or queues
//! work; every rejection is logged naming the call and the argument.

use std::ffi::{c_int, c_longlong, c_void};

use cudarc::cublas::sys::cublasStatus_t;
use half::f16;

use super::invalid;
use super::math::{Accumulate, Elem, GemmPlan, InputRounding, Matrix};
use crate::driver;

/// `CUBLAS_TF32_TENSOR_OP_MATH`, the math mode (low bits) that lets COMPUTE_32F use TF32.
const TF32_TENSOR_OP_MATH: u32 = 3;

/// One GEMM call's raw arguments, as the C entry points receive them.
#[derive(Debug, Clone, Copy)]
pub struct GemmArgs {
    /// Entry point name, for log lines.
    pub call: &'static str,
    /// `cublasOperation_t` of A.
    pub transa: u32,
    /// `cublasOperation_t` of B.
    pub transb: u32,
    /// Rows of op(A) and C.
    pub m: c_int,
    /// Columns of op(B) and C.
    pub n: c_int,
    /// Inner dimension.
    pub k: c_int,
    /// Scale of the product (pointer to the scale type).
    pub alpha: *const c_void,
    /// A's address, `cudaDataType`, leading dimension and batch stride.
    pub a: (u64, u32, c_int, c_longlong),
    /// B's address, `cudaDataType`, leading dimension and batch stride.
    pub b: (u64, u32, c_int, c_longlong),
    /// Scale of C (pointer to the scale type).
    pub beta: *const c_void,
    /// C's address, `cudaDataType`, leading dimension and batch stride.
    pub c: (u64, u32, c_int, c_longlong),
    /// Number of matrices.
    pub batch: c_int,
    /// `cublasComputeType_t`.
    pub compute: u32,
    /// `cublasGemmAlgo_t`.
    pub algo: i32,
}

/// What the scalars alpha and beta are stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scale {
    F16,
    F32,
    F64,
}

impl Scale {
    pub(crate) fn size(self) -> u64 {
        match self {
            Scale::F16 => 2,
            Scale::F32 => 4,
            Scale::F64 => 8,
        }
    }

    /// # Safety
    /// `ptr` addresses a readable value of this type.
    pub(crate) unsafe fn read(self, ptr: u64) -> f64 {
        // SAFETY: forwarded from the caller.
        unsafe {
            match self {
                Scale::F16 => f16::from_bits((ptr as *const u16).read_unaligned()).to_f64(),
                Scale::F32 => (ptr as *const f32).read_unaligned() as f64,
                Scale::F64 => (ptr as *const f64).read_unaligned(),
            }
        }
    }
}

fn elem_of(data_type: u32) -> Option<Elem> {
    match data_type {
        2 => Some(Elem::F16),
        14 => Some(Elem::BF16),
        0 => Some(Elem::F32),
        1 => Some(Elem::F64),
        _ => None,
    }
}

fn not_supported(call: &str, what: &str) -> cublasStatus_t {
    driver::log(&format!("{call}: {what} (CUBLAS_STATUS_NOT_SUPPORTED)"));
    cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED
}

/// The accumulation, input rounding and scale type for a compute type and A/B/C types.
fn arithmetic(
    args: &GemmArgs,
    math_mode: u32,
) -> Result<(Accumulate, InputRounding, Scale), cublasStatus_t> {
    use Elem::*;
    let call = args.call;
    let types = (elem_of(args.a.1), elem_of(args.b.1), elem_of(args.c.1));
    let combo = || {
        format!(
            "Atype {} / Btype {} / Ctype {} with computeType {}",
            args.a.1, args.b.1, args.c.1, args.compute
        )
    };
    let (Some(a), Some(b), Some(c)) = types else {
        return Err(not_supported(
            call,
            &format!("{} (a type the emulator does not model)", combo()),
        ));
    };
    let fits = match args.compute {
        // CUBLAS_COMPUTE_16F(_PEDANTIC): f16 only, f16 scalars.
        64 | 65 => (a, b, c) == (F16, F16, F16),
        // CUBLAS_COMPUTE_32F(_PEDANTIC).
        68 | 69 => matches!(
            (a, b, c),
            (F16, F16, F16)
                | (BF16, BF16, BF16)
                | (F16, F16, F32)
                | (BF16, BF16, F32)
                | (F32, F32, F32)
        ),
        // CUBLAS_COMPUTE_32F_FAST_16F / _16BF / _TF32: f32 data.
        74 | 75 | 77 => (a, b, c) == (F32, F32, F32),
        // CUBLAS_COMPUTE_64F(_PEDANTIC).
        70 | 71 => (a, b, c) == (F64, F64, F64),
        // CUBLAS_COMPUTE_32I(_PEDANTIC), the BF16x9 and fixed-point emulations.
        72 | 73 | 78 | 79 => {
            return Err(not_supported(
                call,
                &format!("computeType {} is not emulated", args.compute),
            ))
        }
        other => {
            return Err(invalid(
                call,
                &format!("computeType {other} is not a cublasComputeType_t"),
            ))
        }
    };
    if !fits {
        return Err(not_supported(call, &combo()));
    }
    Ok(match args.compute {
        64 | 65 => (Accumulate::F32, InputRounding::Exact, Scale::F16),
        68 if a == F32 && math_mode & 0xf == TF32_TENSOR_OP_MATH => {
            (Accumulate::F32, InputRounding::Tf32, Scale::F32)
        }
        74 => (Accumulate::F32, InputRounding::F16, Scale::F32),
        75 => (Accumulate::F32, InputRounding::Bf16, Scale::F32),
        77 => (Accumulate::F32, InputRounding::Tf32, Scale::F32),
        70 | 71 => (Accumulate::F64, InputRounding::Exact, Scale::F64),
        _ => (Accumulate::F32, InputRounding::Exact, Scale::F32),
    })
}

/// A byte range `[start, start + len)` a matrix's batch reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First byte.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// The bytes `rows × cols` matrices with leading dimension `ld` reach over `batch` matrices
/// `stride` elements apart; `None` when the range does not fit the address space.
pub fn matrix_span(
    addr: u64,
    elem: Elem,
    rows: usize,
    cols: usize,
    ld: usize,
    stride: i64,
    batch: usize,
) -> Option<Span> {
    if rows == 0 || cols == 0 || batch == 0 {
        return Some(Span {
            start: addr,
            len: 0,
        });
    }
    let last = (cols as i128 - 1) * ld as i128 + rows as i128;
    let far = (batch as i128 - 1) * stride as i128;
    let (lo, hi) = (far.min(0), far.max(0) + last);
    let size = elem.size() as i128;
    let start = addr as i128 + lo * size;
    let len = (hi - lo) * size;
    (start >= 0 && start + len <= u64::MAX as i128).then_some(Span {
        start: start as u64,
        len: len as u64,
    })
}

/// A validated call: the plan (scalars not yet read) and where everything lives.
#[derive(Debug, Clone, Copy)]
pub struct Validated {
    /// The arithmetic.
    pub plan: GemmPlan,
    /// Byte ranges of A, B, C (A and B empty when not read).
    pub spans: [Span; 3],
    pub(crate) scale: Scale,
}

/// Checks `args` as cuBLAS does (everything but memory); `Ok(None)` is a quick return (nothing
/// to compute).
pub fn validate(args: &GemmArgs, math_mode: u32) -> Result<Option<Validated>, cublasStatus_t> {
    let call = args.call;
    let op = |name: &str, v: u32| match v {
        0 => Ok(false),
        // CUBLAS_OP_C is CUBLAS_OP_T for real types.
        1 | 2 => Ok(true),
        other => Err(invalid(
            call,
            &format!("{name} {other} is not CUBLAS_OP_N, _T or _C"),
        )),
    };
    let (ta, tb) = (op("transa", args.transa)?, op("transb", args.transb)?);
    if args.m < 0 || args.n < 0 || args.k < 0 {
        let (m, n, k) = (args.m, args.n, args.k);
        return Err(invalid(
            call,
            &format!("m {m}, n {n}, k {k}: sizes must not be negative"),
        ));
    }
    let (m, n, k) = (args.m as usize, args.n as usize, args.k as usize);
    let (a_rows, a_cols) = if ta { (k, m) } else { (m, k) };
    let (b_rows, b_cols) = if tb { (n, k) } else { (k, n) };
    for (name, ld, rows) in [
        ("lda", args.a.2, a_rows),
        ("ldb", args.b.2, b_rows),
        ("ldc", args.c.2, m),
    ] {
        if (ld as i64) < rows.max(1) as i64 {
            return Err(invalid(
                call,
                &format!("{name} {ld} is below max(1, {rows}) rows"),
            ));
        }
    }
    if args.batch < 0 {
        return Err(invalid(
            call,
            &format!("batchCount {} is negative", args.batch),
        ));
    }
    let (accumulate, rounding, scale) = arithmetic(args, math_mode)?;
    if !matches!(args.algo, -1..=23 | 99..=115 | 999) {
        return Err(not_supported(
            call,
            &format!("algo {} is not a cublasGemmAlgo_t", args.algo),
        ));
    }
    if args.alpha.is_null() || args.beta.is_null() {
        return Err(invalid(call, "alpha or beta is a null pointer"));
    }
    if m == 0 || n == 0 || args.batch == 0 {
        return Ok(None);
    }
    let batch = args.batch as usize;
    let matrix = |(addr, t, ld, stride): (u64, u32, c_int, c_longlong)| Matrix {
        addr,
        elem: elem_of(t).expect("checked by arithmetic"),
        ld: ld as usize,
        stride,
    };
    let (a, b, c) = (matrix(args.a), matrix(args.b), matrix(args.c));
    let reads_ab = k > 0;
    let span = |x: &Matrix, rows, cols, name: &str| {
        matrix_span(x.addr, x.elem, rows, cols, x.ld, x.stride, batch)
            .ok_or_else(|| invalid(call, &format!("{name}'s batch runs past the address space")))
    };
    let empty = |x: &Matrix| Span {
        start: x.addr,
        len: 0,
    };
    let spans = [
        if reads_ab {
            span(&a, a_rows, a_cols, "A")?
        } else {
            empty(&a)
        },
        if reads_ab {
            span(&b, b_rows, b_cols, "B")?
        } else {
            empty(&b)
        },
        span(&c, m, n, "C")?,
    ];
    let plan = GemmPlan {
        transpose_a: ta,
        transpose_b: tb,
        m,
        n,
        k,
        batch,
        a,
        b,
        c,
        alpha: 0.0,
        beta: 0.0,
        accumulate,
        rounding,
    };
    Ok(Some(Validated { plan, spans, scale }))
}
