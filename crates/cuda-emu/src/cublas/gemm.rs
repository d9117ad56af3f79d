//! The GEMM entry points (`cublasGemmEx`, `cublasGemmStridedBatchedEx`, `cublasGemmBatchedEx`,
//! `cublasSgemm_v2`, `cublasDgemm_v2` and their strided-batched and pointer-array forms). Invariants:
//! - Arguments are validated in cuBLAS's order with cuBLAS's status codes before anything is
//!   queued: an unknown handle is `NOT_INITIALIZED`; a bad operation, a negative size or batch
//!   count, a leading dimension below its minimum or a null scalar is `INVALID_VALUE`; a type or
//!   compute-type combination cuBLAS rejects (or the emulator does not model) is `NOT_SUPPORTED`.
//! - Every matrix's byte range (all batch matrices) must lie in one live allocation on the
//!   stream's device (stricter than cuBLAS, which would fault later): otherwise
//!   `INVALID_VALUE`, with a log line naming the call and the argument. The ranges are checked
//!   again when the work runs; a range freed meanwhile fails the stream with
//!   `CUDA_ERROR_ILLEGAL_ADDRESS`.
//! - Host-mode alpha/beta are read at the call; device-mode ones when the work runs, as on a GPU.
//!   Pointer arrays (the `Batched` forms) must be device memory at the call and are read when
//!   the work runs; each matrix they name is checked then (a bad one fails the stream with
//!   `CUDA_ERROR_ILLEGAL_ADDRESS`, as a faulting kernel would).

use std::ffi::{c_int, c_longlong, c_void};

use cudarc::cublas::sys::{cublasHandle_t, cublasStatus_t};
use cudarc::driver::sys::CUresult;

use super::math;
use super::math::{GemmPlan, Matrix};
use super::validate::{matrix_span, validate, GemmArgs, Span, Validated};
use super::{driver_stream, handle_state, invalid, HandleState};
use crate::{driver, space};

const NAMES: [&str; 3] = ["A", "B", "C"];

/// Checks that every span is live device memory on `device`.
fn check_memory(call: &str, spans: &[Span; 3], device: i32) -> Result<(), cublasStatus_t> {
    for (span, name) in spans.iter().zip(NAMES) {
        if span.len == 0 {
            continue;
        }
        if let Err(e) = space::check_device_range(span.start, span.len) {
            return Err(invalid(
                call,
                &format!("argument {name} is not device memory: {e}"),
            ));
        }
        match space::device_of(span.start) {
            Some(d) if d == device => {}
            other => {
                let on = other.map_or("no device".to_string(), |d| format!("device {d}"));
                return Err(invalid(
                    call,
                    &format!(
                        "argument {name} (0x{:x}) is on {on}, the stream is on device {device}",
                        span.start
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// How a call names its batch matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// A, B, C address matrix 0; the others follow at the strides.
    Strided,
    /// A, B, C address device arrays of `batchCount` matrix pointers (read when the work runs).
    PointerArrays,
}

/// The byte ranges of one batch matrix each of A, B and C in `plan` (A and B empty when k is 0).
fn one_batch_spans(plan: &GemmPlan, call: &str) -> Result<[Span; 3], cublasStatus_t> {
    let (m, n, k) = (plan.m, plan.n, plan.k);
    let (ar, ac) = if plan.transpose_a { (k, m) } else { (m, k) };
    let (br, bc) = if plan.transpose_b { (n, k) } else { (k, n) };
    let span = |x: &Matrix, rows, cols| {
        matrix_span(x.addr, x.elem, rows, cols, x.ld, 0, 1)
            .ok_or_else(|| invalid(call, "a batch matrix runs past the address space"))
    };
    Ok([
        span(&plan.a, ar, ac)?,
        span(&plan.b, br, bc)?,
        span(&plan.c, m, n)?,
    ])
}

/// Validates, checks memory and queues one GEMM call on the handle's stream.
///
/// # Safety
/// Host-mode `alpha`/`beta` point to readable scalars of the compute type's scale type.
pub unsafe fn gemm(handle: cublasHandle_t, args: &GemmArgs, batching: Batching) -> cublasStatus_t {
    let call = args.call;
    let state: HandleState = match handle_state(call, handle) {
        Ok(state) => state,
        Err(status) => return status,
    };
    let Validated {
        mut plan,
        mut spans,
        scale,
    } = match validate(args, state.math_mode) {
        Ok(Some(v)) => v,
        Ok(None) => return cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        Err(status) => return status,
    };
    let arrays = batching == Batching::PointerArrays;
    if arrays {
        // The arrays themselves must be device memory: batchCount pointers each.
        let len = plan.batch as u64 * 8;
        let (a_len, c_len) = (if plan.k > 0 { len } else { 0 }, len);
        spans = [
            Span {
                start: plan.a.addr,
                len: a_len,
            },
            Span {
                start: plan.b.addr,
                len: a_len,
            },
            Span {
                start: plan.c.addr,
                len: c_len,
            },
        ];
    }
    let stream = driver_stream(state.stream);
    let device = match driver::stream_device(stream) {
        Ok(device) => device,
        Err(e) => {
            driver::log(&format!("{call}: the handle's stream is not usable ({e:?}) (CUBLAS_STATUS_EXECUTION_FAILED)"));
            return cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED;
        }
    };
    if device != state.device {
        return invalid(
            call,
            &format!(
                "the handle was created on device {} but its stream is on device {device}",
                state.device
            ),
        );
    }
    if let Err(status) = check_memory(call, &spans, device) {
        return status;
    }
    let (alpha, beta) = (args.alpha as u64, args.beta as u64);
    let device_scalars = state.pointer_mode == 1;
    if device_scalars {
        for (ptr, name) in [(alpha, "alpha"), (beta, "beta")] {
            if let Err(e) = space::check_device_range(ptr, scale.size()) {
                return invalid(
                    call,
                    &format!("{name} is not device memory in CUBLAS_POINTER_MODE_DEVICE: {e}"),
                );
            }
        }
    } else {
        for (ptr, name) in [(alpha, "alpha"), (beta, "beta")] {
            if space::device_of(ptr).is_some() {
                return invalid(
                    call,
                    &format!("{name} (0x{ptr:x}) is a device pointer in CUBLAS_POINTER_MODE_HOST"),
                );
            }
        }
        // SAFETY: host-mode scalars are readable (the caller's contract).
        unsafe {
            plan.alpha = scale.read(alpha);
            plan.beta = scale.read(beta);
        }
    }
    let work = move || {
        if let Err(status) = check_memory(call, &spans, device) {
            let _ = status;
            driver::log(&format!(
                "{call}: a matrix was freed before the GEMM ran (CUDA_ERROR_ILLEGAL_ADDRESS)"
            ));
            return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        }
        if device_scalars {
            for ptr in [alpha, beta] {
                if space::check_device_range(ptr, scale.size()).is_err() {
                    driver::log(&format!("{call}: alpha/beta were freed before the GEMM ran (CUDA_ERROR_ILLEGAL_ADDRESS)"));
                    return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                }
            }
            // SAFETY: both scalars were just checked to be live device memory.
            unsafe {
                plan.alpha = scale.read(alpha);
                plan.beta = scale.read(beta);
            }
        }
        if !arrays {
            // SAFETY: every matrix range was just checked to be live device memory, which the
            // emulator maps readable and writable in this process.
            unsafe { math::run(&plan) };
            return Ok(());
        }
        let arrays = [plan.a.addr, plan.b.addr, plan.c.addr];
        for index in 0..plan.batch {
            let mut one = plan;
            one.batch = 1;
            for (which, (matrix, array)) in [&mut one.a, &mut one.b, &mut one.c]
                .into_iter()
                .zip(arrays)
                .enumerate()
            {
                // A and B are not read when k is 0 (their arrays were not checked either).
                let used = which == 2 || plan.k > 0;
                // SAFETY: a used array was just checked to hold `batch` pointers.
                let at = (array + index as u64 * 8) as *const u64;
                matrix.addr = if used {
                    unsafe { at.read_unaligned() }
                } else {
                    0
                };
            }
            let fault = |what: String| {
                driver::log(&format!(
                    "{call}: batch matrix {index}: {what} (CUDA_ERROR_ILLEGAL_ADDRESS)"
                ));
                Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)
            };
            let Ok(mut one_spans) = one_batch_spans(&one, call) else {
                return fault("runs past the address space".into());
            };
            if one.k == 0 {
                one_spans[0].len = 0;
                one_spans[1].len = 0;
            }
            if check_memory(call, &one_spans, device).is_err() {
                return fault(
                    "a pointer in the array is not live device memory of the stream's device"
                        .into(),
                );
            }
            // SAFETY: this batch matrix's ranges were just checked to be live device memory.
            unsafe { math::run(&one) };
        }
        Ok(())
    };
    match driver::enqueue(stream, Box::new(work)) {
        Ok(()) => cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        Err(e) => {
            driver::log(&format!(
                "{call}: queueing on the stream failed ({e:?}) (CUBLAS_STATUS_EXECUTION_FAILED)"
            ));
            cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED
        }
    }
}

/// `C = alpha·op(A)·op(B) + beta·C` with typed matrices and a compute type.
#[no_mangle]
pub unsafe extern "C" fn cublasGemmEx(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: u32,
    lda: c_int,
    b: *const c_void,
    b_type: u32,
    ldb: c_int,
    beta: *const c_void,
    c: *mut c_void,
    c_type: u32,
    ldc: c_int,
    compute: u32,
    algo: i32,
) -> cublasStatus_t {
    let args = GemmArgs {
        call: "cublasGemmEx",
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        a: (a as u64, a_type, lda, 0),
        b: (b as u64, b_type, ldb, 0),
        beta,
        c: (c as u64, c_type, ldc, 0),
        batch: 1,
        compute,
        algo,
    };
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::Strided) }
}

/// [`cublasGemmEx`] over `batchCount` matrices at fixed element strides.
#[no_mangle]
pub unsafe extern "C" fn cublasGemmStridedBatchedEx(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: u32,
    lda: c_int,
    stride_a: c_longlong,
    b: *const c_void,
    b_type: u32,
    ldb: c_int,
    stride_b: c_longlong,
    beta: *const c_void,
    c: *mut c_void,
    c_type: u32,
    ldc: c_int,
    stride_c: c_longlong,
    batch: c_int,
    compute: u32,
    algo: i32,
) -> cublasStatus_t {
    let args = GemmArgs {
        call: "cublasGemmStridedBatchedEx",
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        a: (a as u64, a_type, lda, stride_a),
        b: (b as u64, b_type, ldb, stride_b),
        beta,
        c: (c as u64, c_type, ldc, stride_c),
        batch,
        compute,
        algo,
    };
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::Strided) }
}

/// [`cublasGemmEx`] over `batchCount` matrices named by device arrays of pointers.
#[no_mangle]
pub unsafe extern "C" fn cublasGemmBatchedEx(
    handle: cublasHandle_t,
    transa: u32,
    transb: u32,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a_array: *const *const c_void,
    a_type: u32,
    lda: c_int,
    b_array: *const *const c_void,
    b_type: u32,
    ldb: c_int,
    beta: *const c_void,
    c_array: *const *mut c_void,
    c_type: u32,
    ldc: c_int,
    batch: c_int,
    compute: u32,
    algo: i32,
) -> cublasStatus_t {
    let args = GemmArgs {
        call: "cublasGemmBatchedEx",
        transa,
        transb,
        m,
        n,
        k,
        alpha,
        a: (a_array as u64, a_type, lda, 0),
        b: (b_array as u64, b_type, ldb, 0),
        beta,
        c: (c_array as u64, c_type, ldc, 0),
        batch,
        compute,
        algo,
    };
    // SAFETY: the caller's contract is cuBLAS's.
    unsafe { gemm(handle, &args, Batching::PointerArrays) }
}
