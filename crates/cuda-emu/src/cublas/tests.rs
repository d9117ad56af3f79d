//! GEMM arithmetic against a naive f64 reference (every op combination, type and compute type),
//! TF32 rounding, beta = 0 / alpha = 0 never reading C / A and B, and cuBLAS's status codes for
//! bad arguments.

use std::ffi::c_void;

use cudarc::cublas::sys::cublasStatus_t as S;
use half::{bf16, f16};

use super::math::{self, round_tf32, Accumulate, Elem, GemmPlan, InputRounding, Matrix};
use super::validate::{matrix_span, validate, GemmArgs, Span};

/// Deterministic values in [-2, 2) with a few bits below f16 precision.
fn values(seed: u64, len: usize) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
        })
        .collect()
}

/// Host storage of one type, and its values read back as f64.
enum Buf {
    F16(Vec<u16>),
    BF16(Vec<u16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Buf {
    fn new(elem: Elem, v: &[f64]) -> Buf {
        match elem {
            Elem::F16 => Buf::F16(v.iter().map(|&x| f16::from_f64(x).to_bits()).collect()),
            Elem::BF16 => Buf::BF16(v.iter().map(|&x| bf16::from_f64(x).to_bits()).collect()),
            Elem::F32 => Buf::F32(v.iter().map(|&x| x as f32).collect()),
            Elem::F64 => Buf::F64(v.to_vec()),
        }
    }
    fn addr(&mut self) -> u64 {
        match self {
            Buf::F16(v) | Buf::BF16(v) => v.as_mut_ptr() as u64,
            Buf::F32(v) => v.as_mut_ptr() as u64,
            Buf::F64(v) => v.as_mut_ptr() as u64,
        }
    }
    fn get(&self, i: usize) -> f64 {
        match self {
            Buf::F16(v) => f16::from_bits(v[i]).to_f64(),
            Buf::BF16(v) => bf16::from_bits(v[i]).to_f64(),
            Buf::F32(v) => v[i] as f64,
            Buf::F64(v) => v[i],
        }
    }
}

fn ulp(elem: Elem, x: f64) -> f64 {
    let bits = match elem {
        Elem::F16 => 10,
        Elem::BF16 => 7,
        Elem::F32 => 23,
        Elem::F64 => 52,
    };
    let e = x.abs().max(1e-30).log2().floor();
    2f64.powf(e - bits as f64)
}

fn round_ref(x: f64, rounding: InputRounding) -> f64 {
    match rounding {
        InputRounding::Exact => x,
        InputRounding::Tf32 => round_tf32(x as f32) as f64,
        InputRounding::F16 => f16::from_f64(x).to_f64(),
        InputRounding::Bf16 => bf16::from_f64(x).to_f64(),
    }
}

/// Runs one (batched) GEMM through `math::run` and checks every element of C against the f64
/// reference of the (rounded) inputs.
#[allow(clippy::too_many_arguments)]
fn check(
    ta: bool,
    tb: bool,
    types: (Elem, Elem),
    acc: Accumulate,
    rounding: InputRounding,
    beta: f64,
) {
    let (m, n, k, batch) = (5, 4, 7, 3);
    let (ab, ce) = types;
    let (a_rows, a_cols) = if ta { (k, m) } else { (m, k) };
    let (b_rows, b_cols) = if tb { (n, k) } else { (k, n) };
    let (lda, ldb, ldc) = (a_rows + 2, b_rows + 1, m + 3);
    let (sa, sb, sc) = (lda * a_cols + 1, 0, ldc * n);
    let mut a = Buf::new(ab, &values(1, sa * batch));
    let mut b = Buf::new(ab, &values(2, ldb * b_cols));
    let c0 = values(3, sc * batch);
    let mut c = Buf::new(ce, &c0);
    let c_before: Vec<f64> = (0..sc * batch).map(|i| c.get(i)).collect();
    let alpha = 1.5;
    let plan = GemmPlan {
        transpose_a: ta,
        transpose_b: tb,
        m,
        n,
        k,
        batch,
        a: Matrix {
            addr: a.addr(),
            elem: ab,
            ld: lda,
            stride: sa as i64,
        },
        b: Matrix {
            addr: b.addr(),
            elem: ab,
            ld: ldb,
            stride: sb as i64,
        },
        c: Matrix {
            addr: c.addr(),
            elem: ce,
            ld: ldc,
            stride: sc as i64,
        },
        alpha,
        beta,
        accumulate: acc,
        rounding,
    };
    // SAFETY: the buffers hold every element the plan reaches.
    unsafe { math::run(&plan) };
    for bi in 0..batch {
        for j in 0..n {
            for i in 0..m {
                let (mut sum, mut mag) = (0.0, 0.0);
                for p in 0..k {
                    let ai = if ta { p + i * lda } else { i + p * lda } + bi * sa;
                    let bj = if tb { j + p * ldb } else { p + j * ldb } + bi * sb;
                    let x = round_ref(a.get(ai), rounding) * round_ref(b.get(bj), rounding);
                    sum += x;
                    mag += x.abs();
                }
                let ci = i + j * ldc + bi * sc;
                let want = alpha * sum + beta * c_before[ci];
                let got = c.get(ci);
                let acc_err =
                    if acc == Accumulate::F64 { 1e-13 } else { 1e-6 } * (mag * alpha + 1.0);
                let tol = ulp(ce, want) + acc_err;
                assert!(
                    (got - want).abs() <= tol,
                    "ta {ta} tb {tb} {types:?} {rounding:?} beta {beta}: C[{bi}][{i},{j}] = {got}, want {want}"
                );
            }
        }
        // Padding rows between columns are untouched.
        for j in 0..n {
            for i in m..ldc {
                let ci = i + j * ldc + bi * sc;
                assert_eq!(
                    c.get(ci).to_bits(),
                    c_before[ci].to_bits(),
                    "padding C[{bi}][{i},{j}]"
                );
            }
        }
    }
}

#[test]
fn every_op_combination_type_and_compute_type_matches_the_f64_reference() {
    let cases = [
        (
            (Elem::F32, Elem::F32),
            Accumulate::F32,
            InputRounding::Exact,
        ),
        ((Elem::F32, Elem::F32), Accumulate::F32, InputRounding::Tf32),
        ((Elem::F32, Elem::F32), Accumulate::F32, InputRounding::F16),
        ((Elem::F32, Elem::F32), Accumulate::F32, InputRounding::Bf16),
        (
            (Elem::F64, Elem::F64),
            Accumulate::F64,
            InputRounding::Exact,
        ),
        (
            (Elem::F16, Elem::F16),
            Accumulate::F32,
            InputRounding::Exact,
        ),
        (
            (Elem::BF16, Elem::BF16),
            Accumulate::F32,
            InputRounding::Exact,
        ),
        (
            (Elem::F16, Elem::F32),
            Accumulate::F32,
            InputRounding::Exact,
        ),
        (
            (Elem::BF16, Elem::F32),
            Accumulate::F32,
            InputRounding::Exact,
        ),
    ];
    for (types, acc, rounding) in cases {
        for ta in [false, true] {
            for tb in [false, true] {
                for beta in [0.0, 0.5] {
                    check(ta, tb, types, acc, rounding, beta);
                }
            }
        }
    }
}

#[test]
fn tf32_rounds_to_ten_mantissa_bits_nearest_ties_away() {
    assert_eq!(round_tf32(1.0 + 2f32.powi(-12)), 1.0);
    // Exactly halfway between 1 and 1 + 2^-10: away from zero.
    assert_eq!(round_tf32(1.0 + 2f32.powi(-11)), 1.0 + 2f32.powi(-10));
    assert_eq!(round_tf32(-(1.0 + 2f32.powi(-11))), -(1.0 + 2f32.powi(-10)));
    assert_eq!(round_tf32(1.0 + 3.0 * 2f32.powi(-12)), 1.0 + 2f32.powi(-10));
    assert_eq!(round_tf32(f32::MAX), f32::INFINITY);
    assert!(round_tf32(f32::NAN).is_nan());
    assert_eq!(round_tf32(f32::NEG_INFINITY), f32::NEG_INFINITY);
    // A value TF32 drops entirely changes a product: 1 · (1 + 2^-12) is 1 under TF32.
    let (mut a, mut b, mut c) = ([1.0f32 + 2f32.powi(-12)], [1.0f32], [0.0f32]);
    let plan = |rounding, c: &mut [f32; 1], a: &mut [f32; 1], b: &mut [f32; 1]| GemmPlan {
        transpose_a: false,
        transpose_b: false,
        m: 1,
        n: 1,
        k: 1,
        batch: 1,
        a: Matrix {
            addr: a.as_mut_ptr() as u64,
            elem: Elem::F32,
            ld: 1,
            stride: 0,
        },
        b: Matrix {
            addr: b.as_mut_ptr() as u64,
            elem: Elem::F32,
            ld: 1,
            stride: 0,
        },
        c: Matrix {
            addr: c.as_mut_ptr() as u64,
            elem: Elem::F32,
            ld: 1,
            stride: 0,
        },
        alpha: 1.0,
        beta: 0.0,
        accumulate: Accumulate::F32,
        rounding,
    };
    // SAFETY: 1×1 matrices in live arrays.
    unsafe { math::run(&plan(InputRounding::Tf32, &mut c, &mut a, &mut b)) };
    assert_eq!(c[0], 1.0);
    // SAFETY: as above.
    unsafe { math::run(&plan(InputRounding::Exact, &mut c, &mut a, &mut b)) };
    assert_eq!(c[0], 1.0 + 2f32.powi(-12));
}

#[test]
fn beta_zero_never_reads_c_and_alpha_zero_never_reads_a_or_b() {
    for (c_elem, acc, ab_elem) in [
        (Elem::F32, Accumulate::F32, Elem::F32),
        (Elem::F16, Accumulate::F32, Elem::F16),
        (Elem::BF16, Accumulate::F32, Elem::BF16),
        (Elem::F64, Accumulate::F64, Elem::F64),
    ] {
        let mut a = Buf::new(ab_elem, &[1.0, 2.0, 3.0, 4.0]);
        let mut b = Buf::new(ab_elem, &[1.0, 0.0, 0.0, 1.0]);
        let mut c = Buf::new(c_elem, &[f64::NAN; 4]);
        let mut plan = GemmPlan {
            transpose_a: false,
            transpose_b: false,
            m: 2,
            n: 2,
            k: 2,
            batch: 1,
            a: Matrix {
                addr: a.addr(),
                elem: ab_elem,
                ld: 2,
                stride: 0,
            },
            b: Matrix {
                addr: b.addr(),
                elem: ab_elem,
                ld: 2,
                stride: 0,
            },
            c: Matrix {
                addr: c.addr(),
                elem: c_elem,
                ld: 2,
                stride: 0,
            },
            alpha: 1.0,
            beta: 0.0,
            accumulate: acc,
            rounding: InputRounding::Exact,
        };
        // SAFETY: 2×2 matrices in live buffers.
        unsafe { math::run(&plan) };
        assert_eq!(
            (0..4).map(|i| c.get(i)).collect::<Vec<_>>(),
            [1.0, 2.0, 3.0, 4.0],
            "{c_elem:?}"
        );
        // alpha = 0: C = beta·C, A's NaNs unread.
        let mut nan_a = Buf::new(ab_elem, &[f64::NAN; 4]);
        plan.a.addr = nan_a.addr();
        plan.alpha = 0.0;
        plan.beta = 2.0;
        // SAFETY: as above.
        unsafe { math::run(&plan) };
        assert_eq!(
            (0..4).map(|i| c.get(i)).collect::<Vec<_>>(),
            [2.0, 4.0, 6.0, 8.0],
            "{c_elem:?}"
        );
        // alpha = 0 and beta = 0: zeros, even over NaN.
        let mut nan_c = Buf::new(c_elem, &[f64::NAN; 4]);
        plan.c.addr = nan_c.addr();
        plan.beta = 0.0;
        // SAFETY: as above.
        unsafe { math::run(&plan) };
        assert_eq!(
            (0..4).map(|i| nan_c.get(i)).collect::<Vec<_>>(),
            [0.0; 4],
            "{c_elem:?}"
        );
    }
}

fn args(compute: u32, types: (u32, u32, u32)) -> GemmArgs {
    static ONE: f64 = 1.0;
    let one = (&ONE as *const f64).cast::<c_void>();
    GemmArgs {
        call: "test",
        transa: 0,
        transb: 1,
        m: 4,
        n: 3,
        k: 2,
        alpha: one,
        a: (0x1000, types.0, 4, 8),
        b: (0x2000, types.1, 3, 6),
        beta: one,
        c: (0x3000, types.2, 4, 12),
        batch: 2,
        compute,
        algo: -1,
    }
}

fn status(a: &GemmArgs) -> S {
    match validate(a, 0) {
        Ok(_) => S::CUBLAS_STATUS_SUCCESS,
        Err(s) => s,
    }
}

#[test]
fn bad_arguments_get_cublas_status_codes() {
    let ok = args(68, (0, 0, 0));
    assert_eq!(status(&ok), S::CUBLAS_STATUS_SUCCESS);
    let with = |f: &dyn Fn(&mut GemmArgs)| {
        let mut a = ok;
        f(&mut a);
        status(&a)
    };
    assert_eq!(with(&|a| a.m = -1), S::CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(with(&|a| a.k = -1), S::CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(with(&|a| a.transa = 3), S::CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(
        with(&|a| a.transb = 2),
        S::CUBLAS_STATUS_SUCCESS,
        "OP_C is OP_T for real data"
    );
    // lda >= m for op N, ldb >= n for op T, ldc >= m.
    assert_eq!(with(&|a| a.a.2 = 3), S::CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(with(&|a| a.b.2 = 2), S::CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(with(&|a| a.c.2 = 3), S::CUBLAS_STATUS_INVALID_VALUE);
    // op T on A: A is k×m, lda >= k.
    assert_eq!(
        with(&|a| {
            a.transa = 1;
            a.a.2 = 2
        }),
        S::CUBLAS_STATUS_SUCCESS
    );
    assert_eq!(
        with(&|a| {
            a.transa = 1;
            a.a.2 = 1
        }),
        S::CUBLAS_STATUS_INVALID_VALUE
    );
    // lda is at least 1 even for an empty matrix.
    assert_eq!(
        with(&|a| {
            a.m = 0;
            a.a.2 = 0
        }),
        S::CUBLAS_STATUS_INVALID_VALUE
    );
    assert_eq!(with(&|a| a.batch = -1), S::CUBLAS_STATUS_INVALID_VALUE);
    assert_eq!(
        with(&|a| a.alpha = std::ptr::null()),
        S::CUBLAS_STATUS_INVALID_VALUE
    );
    assert_eq!(with(&|a| a.algo = 50), S::CUBLAS_STATUS_NOT_SUPPORTED);
    assert_eq!(with(&|a| a.compute = 1234), S::CUBLAS_STATUS_INVALID_VALUE);
    // Type combinations.
    for (compute, types, want) in [
        (68, (2, 2, 2), S::CUBLAS_STATUS_SUCCESS),
        (68, (14, 14, 0), S::CUBLAS_STATUS_SUCCESS),
        (68, (2, 14, 2), S::CUBLAS_STATUS_NOT_SUPPORTED),
        (68, (1, 1, 1), S::CUBLAS_STATUS_NOT_SUPPORTED),
        (70, (1, 1, 1), S::CUBLAS_STATUS_SUCCESS),
        (70, (0, 0, 0), S::CUBLAS_STATUS_NOT_SUPPORTED),
        (64, (2, 2, 2), S::CUBLAS_STATUS_SUCCESS),
        (64, (2, 2, 0), S::CUBLAS_STATUS_NOT_SUPPORTED),
        (77, (0, 0, 0), S::CUBLAS_STATUS_SUCCESS),
        (77, (2, 2, 2), S::CUBLAS_STATUS_NOT_SUPPORTED),
        (72, (3, 3, 10), S::CUBLAS_STATUS_NOT_SUPPORTED),
        (68, (4, 4, 4), S::CUBLAS_STATUS_NOT_SUPPORTED),
    ] {
        assert_eq!(
            status(&args(compute, types)),
            want,
            "compute {compute} types {types:?}"
        );
    }
    // Empty problems are a quick success.
    assert!(matches!(validate(&args(68, (0, 0, 0)), 0), Ok(Some(_))));
    assert!(matches!(validate(&GemmArgs { n: 0, ..ok }, 0), Ok(None)));
    assert!(matches!(
        validate(&GemmArgs { batch: 0, ..ok }, 0),
        Ok(None)
    ));
}

#[test]
fn tf32_math_mode_rounds_compute_32f_but_not_pedantic() {
    let v = |compute, mode| {
        validate(&args(compute, (0, 0, 0)), mode)
            .unwrap()
            .unwrap()
            .plan
            .rounding
    };
    assert_eq!(v(68, 0), InputRounding::Exact);
    assert_eq!(v(68, 3), InputRounding::Tf32);
    assert_eq!(v(68, 3 | 16), InputRounding::Tf32);
    assert_eq!(v(69, 3), InputRounding::Exact);
    assert_eq!(v(74, 0), InputRounding::F16);
    assert_eq!(v(75, 0), InputRounding::Bf16);
    assert_eq!(v(77, 0), InputRounding::Tf32);
}

#[test]
fn spans_cover_every_batch_matrix() {
    // 3×2 with ld 4: last element at 1*4 + 2 = 6, so 7 elements; batch 2 stride 10: 17.
    let s = matrix_span(0x1000, Elem::F32, 3, 2, 4, 10, 2).unwrap();
    assert_eq!(
        s,
        Span {
            start: 0x1000,
            len: 17 * 4
        }
    );
    // A negative stride reaches below the base.
    let s = matrix_span(0x1000, Elem::F16, 3, 2, 4, -10, 2).unwrap();
    assert_eq!(
        s,
        Span {
            start: 0x1000 - 20,
            len: 17 * 2
        }
    );
    // Broadcast: stride 0 is one matrix.
    assert_eq!(
        matrix_span(0x1000, Elem::F64, 3, 2, 4, 0, 5).unwrap().len,
        7 * 8
    );
    assert_eq!(matrix_span(8, Elem::F32, 3, 2, 4, -10, 2), None);
}

#[test]
fn a_resnet_sized_gemm_is_quick() {
    // A 3×3 conv of 64 channels at 14×14, batch 4, as im2col: (4·196) × 576 · 576 × 64.
    let (m, n, k) = (64, 4 * 196, 576);
    let a: Vec<f32> = values(7, m * k).iter().map(|&x| x as f32).collect();
    let b: Vec<f32> = values(8, k * n).iter().map(|&x| x as f32).collect();
    let mut c = vec![0f32; m * n];
    let plan = GemmPlan {
        transpose_a: false,
        transpose_b: false,
        m,
        n,
        k,
        batch: 1,
        a: Matrix {
            addr: a.as_ptr() as u64,
            elem: Elem::F32,
            ld: m,
            stride: 0,
        },
        b: Matrix {
            addr: b.as_ptr() as u64,
            elem: Elem::F32,
            ld: k,
            stride: 0,
        },
        c: Matrix {
            addr: c.as_mut_ptr() as u64,
            elem: Elem::F32,
            ld: m,
            stride: 0,
        },
        alpha: 1.0,
        beta: 0.0,
        accumulate: Accumulate::F32,
        rounding: InputRounding::Tf32,
    };
    let start = std::time::Instant::now();
    // SAFETY: the vectors hold the matrices.
    unsafe { math::run(&plan) };
    let took = start.elapsed();
    assert!(took.as_secs_f64() < 5.0, "{m}x{n}x{k} took {took:?}");
    assert!(c.iter().all(|x| x.is_finite()));
}
