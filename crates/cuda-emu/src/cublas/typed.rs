//! The legacy typed GEMM entry points (`cublasSgemm_v2`, `cublasDgemm_v2`, their strided-batched
//! and pointer-array forms): each is [`super::gemm::gemm`] with one data type for A, B, C and the
//! scalars, and cuBLAS's compute type for it (`CUBLAS_COMPUTE_32F`, TF32 under the TF32 math
//! mode; `CUBLAS_COMPUTE_64F`). Invariant: no arithmetic or validation of its own.

use std::ffi::{c_int, c_longlong};

use cudarc::cublas::sys::{cublasComputeType_t, cublasHandle_t, cublasStatus_t, cudaDataType};

use super::gemm::{gemm, Batching};
use super::validate::GemmArgs;

/// `CUDA_R_32F`: A, B, C and the scalars of the `S` entry points.
const R_32F: u32 = cudaDataType::CUDA_R_32F as u32;
/// `CUDA_R_64F`: A, B, C and the scalars of the `D` entry points.
const R_64F: u32 = cudaDataType::CUDA_R_64F as u32;
/// `CUBLAS_COMPUTE_32F` (TF32 under the TF32 math mode), the `S` entry points' compute type.
const COMPUTE_32F: u32 = cublasComputeType_t::CUBLAS_COMPUTE_32F as u32;
/// `CUBLAS_COMPUTE_64F`, the `D` entry points' compute type.
const COMPUTE_64F: u32 = cublasComputeType_t::CUBLAS_COMPUTE_64F as u32;

/// The arguments of a legacy typed GEMM (one data type for A, B, C and the scalars).
#[allow(clippy::too_many_arguments)]
fn typed<T>(
    call: &'static str,
    data: u32,
    compute: u32,
    (transa, transb, m, n, k): (u32, u32, c_int, c_int, c_int),
    (alpha, beta): (*const T, *const T),
    a: (*const T, c_int, c_longlong),
    b: (*const T, c_int, c_longlong),
    c: (*mut T, c_int, c_longlong),
    batch: c_int,
) -> GemmArgs {
    GemmArgs {
        call,
        transa,
        transb,
        m,
        n,
        k,
        alpha: alpha.cast(),
        a: (a.0 as u64, data, a.1, a.2),
        b: (b.0 as u64, data, b.1, b.2),
        beta: beta.cast(),
        c: (c.0 as u64, data, c.1, c.2),
        batch,
        compute,
        algo: -1,
    }
}

/// f32 (`CUBLAS_COMPUTE_32F`; TF32 under the TF32 math mode) GEMM (see [`super::gemm::cublasGemmEx`]).
#[no_mangle]
pub unsafe extern "C" fn cublasSgemm_v2(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
) -> cublasStatus_t {
    let shape = (transa, transb, m, n, k);
    let args = typed(
        "cublasSgemm_v2",
        R_32F,
        COMPUTE_32F,
        shape,
        (alpha, beta),
        (a, lda, 0),
        (b, ldb, 0),
        (c, ldc, 0),
        1,
    );
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::Strided) }
}

/// f32 (`CUBLAS_COMPUTE_32F`; TF32 under the TF32 math mode) strided-batched GEMM (see [`super::gemm::cublasGemmStridedBatchedEx`]).
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmStridedBatched(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    stride_a: c_longlong,
    b: *const f32,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
) -> cublasStatus_t {
    let shape = (transa, transb, m, n, k);
    let scalars = (alpha, beta);
    let (a, b, c) = ((a, lda, stride_a), (b, ldb, stride_b), (c, ldc, stride_c));
    let args = typed(
        "cublasSgemmStridedBatched",
        R_32F,
        COMPUTE_32F,
        shape,
        scalars,
        a,
        b,
        c,
        batch,
    );
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::Strided) }
}

/// f64 GEMM (see [`super::gemm::cublasGemmEx`]).
#[no_mangle]
pub unsafe extern "C" fn cublasDgemm_v2(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    a: *const f64,
    lda: c_int,
    b: *const f64,
    ldb: c_int,
    beta: *const f64,
    c: *mut f64,
    ldc: c_int,
) -> cublasStatus_t {
    let shape = (transa, transb, m, n, k);
    let args = typed(
        "cublasDgemm_v2",
        R_64F,
        COMPUTE_64F,
        shape,
        (alpha, beta),
        (a, lda, 0),
        (b, ldb, 0),
        (c, ldc, 0),
        1,
    );
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::Strided) }
}

/// f64 strided-batched GEMM (see [`super::gemm::cublasGemmStridedBatchedEx`]).
#[no_mangle]
pub unsafe extern "C" fn cublasDgemmStridedBatched(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    a: *const f64,
    lda: c_int,
    stride_a: c_longlong,
    b: *const f64,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const f64,
    c: *mut f64,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
) -> cublasStatus_t {
    let shape = (transa, transb, m, n, k);
    let scalars = (alpha, beta);
    let (a, b, c) = ((a, lda, stride_a), (b, ldb, stride_b), (c, ldc, stride_c));
    let args = typed(
        "cublasDgemmStridedBatched",
        R_64F,
        COMPUTE_64F,
        shape,
        scalars,
        a,
        b,
        c,
        batch,
    );
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::Strided) }
}

/// f32 GEMM over device arrays of matrix pointers (see [`super::gemm::cublasGemmBatchedEx`]).
#[no_mangle]
pub unsafe extern "C" fn cublasSgemmBatched(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a_array: *const *const f32,
    lda: c_int,
    b_array: *const *const f32,
    ldb: c_int,
    beta: *const f32,
    c_array: *const *mut f32,
    ldc: c_int,
    batch: c_int,
) -> cublasStatus_t {
    let shape = (transa, transb, m, n, k);
    let (a, b, c) = (
        (a_array.cast(), lda, 0),
        (b_array.cast(), ldb, 0),
        (c_array as *mut f32, ldc, 0),
    );
    let args = typed(
        "cublasSgemmBatched",
        R_32F,
        COMPUTE_32F,
        shape,
        (alpha, beta),
        a,
        b,
        c,
        batch,
    );
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::PointerArrays) }
}

/// f64 GEMM over device arrays of matrix pointers (see [`super::gemm::cublasGemmBatchedEx`]).
#[no_mangle]
pub unsafe extern "C" fn cublasDgemmBatched(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f64,
    a_array: *const *const f64,
    lda: c_int,
    b_array: *const *const f64,
    ldb: c_int,
    beta: *const f64,
    c_array: *const *mut f64,
    ldc: c_int,
    batch: c_int,
) -> cublasStatus_t {
    let shape = (transa, transb, m, n, k);
    let (a, b, c) = (
        (a_array.cast(), lda, 0),
        (b_array.cast(), ldb, 0),
        (c_array as *mut f64, ldc, 0),
    );
    let args = typed(
        "cublasDgemmBatched",
        R_64F,
        COMPUTE_64F,
        shape,
        (alpha, beta),
        a,
        b,
        c,
        batch,
    );
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::PointerArrays) }
}
