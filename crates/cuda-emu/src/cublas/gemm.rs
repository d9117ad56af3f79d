//! The GEMM entry points (`cublasGemmEx`, `cublasGemmStridedBatchedEx`, `cublasGemmBatchedEx`,
//! `cublasSgemm_v2`, `cublasDgemm_v2` and their strided-batched and pointer-array forms). Invariants:
//! - Arguments are validated in cuBLAS's order with cuBLAS's status codes before anything is
//!   queued: an unknown handle is `NOT_INITIALIZED`; a bad operation, a negative size or batch
//!   count, a leading dimension below its minimum or a null scalar is `INVALID_VALUE`; a type or
//!   compute-type combination cuBLAS rejects (or the emulator does not model) is `NOT_SUPPORTED`.
//! - Every matrix's byte range (all batch matrices) must lie in one live allocation on the
//!   stream's device (stricter than cuBLAS, which would fault later): otherwise
//!   `INVALID_VALUE`, with a log line naming the call and the argument. When the work runs, the
//!   ranges are held live for its duration (`space::with_live`: a concurrent `cuMemFree`
//!   waits); a range freed before it ran fails the stream with `CUDA_ERROR_ILLEGAL_ADDRESS`.
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

/// The (A, B, C) matrix addresses of every batch entry of `plan`'s pointer arrays (A and B 0
/// when k is 0: their arrays are not read).
///
/// # Safety
/// The arrays at `plan.a/b/c.addr` hold `plan.batch` readable pointers (A's and B's only when
/// k > 0).
unsafe fn read_pointer_arrays(plan: &GemmPlan) -> Vec<[u64; 3]> {
    let arrays = [plan.a.addr, plan.b.addr, plan.c.addr];
    (0..plan.batch)
        .map(|index| {
            std::array::from_fn(|which| {
                let used = which == 2 || plan.k > 0;
                let at = (arrays[which] + index as u64 * 8) as *const u64;
                // SAFETY: forwarded from the caller.
                if used {
                    unsafe { at.read_unaligned() }
                } else {
                    0
                }
            })
        })
        .collect()
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
        let freed = |what: String| {
            driver::log(&format!("{call}: {what} (CUDA_ERROR_ILLEGAL_ADDRESS)"));
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        };
        let scalars = if device_scalars {
            vec![(alpha, scale.size()), (beta, scale.size())]
        } else {
            Vec::new()
        };
        // Matrices (or pointer arrays) and device scalars stay live while the work reads them
        // (a concurrent cuMemFree waits); one freed before the work ran is a fault.
        let mut ranges: Vec<(u64, u64)> = spans
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| (s.start, s.len))
            .collect();
        ranges.extend(&scalars);
        let pointers = space::with_live(&ranges, || {
            if device_scalars {
                // SAFETY: both scalars are live device memory for this closure.
                unsafe {
                    plan.alpha = scale.read(alpha);
                    plan.beta = scale.read(beta);
                }
            }
            if arrays {
                // SAFETY: the arrays are live and hold `batch` pointers each (A's and B's only
                // when k > 0; otherwise their pointers are never used).
                unsafe { read_pointer_arrays(&plan) }
            } else {
                // SAFETY: every matrix range is live device memory for this closure, which
                // the emulator maps readable and writable in this process.
                unsafe { math::run(&plan) };
                Vec::new()
            }
        })
        .map_err(|e| freed(format!("memory was freed before the GEMM ran: {e}")))?;
        for (index, [a, b, c]) in pointers.into_iter().enumerate() {
            let mut one = plan;
            (one.batch, one.a.addr, one.b.addr, one.c.addr) = (1, a, b, c);
            let fault = |what: &str| freed(format!("batch matrix {index}: {what}"));
            let mut one_spans =
                one_batch_spans(&one, call).map_err(|_| fault("runs past the address space"))?;
            if one.k == 0 {
                one_spans[0].len = 0;
                one_spans[1].len = 0;
            }
            if check_memory(call, &one_spans, device).is_err() {
                return Err(fault(
                    "a pointer in the array is not live device memory of the stream's device",
                ));
            }
            let ranges: Vec<(u64, u64)> = one_spans
                .iter()
                .filter(|s| s.len > 0)
                .map(|s| (s.start, s.len))
                .collect();
            // SAFETY: this batch matrix's ranges are live device memory for the closure.
            space::with_live(&ranges, || unsafe { math::run(&one) })
                .map_err(|e| fault(&format!("freed while the GEMM ran: {e}")))?;
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
