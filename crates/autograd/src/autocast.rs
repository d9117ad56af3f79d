//! `autocast`: mixed precision by op lists, per thread (PyTorch's `torch.autocast`).
//!
//! Inside an autocast scope with a 16-bit `dtype` (`BF16` or `F16`), ops run in the precision
//! PyTorch's autocast lists give them:
//! - **lower precision** (`matmul`, `conv2d`, and everything built on them such as linear
//!   layers): eligible float inputs (`F32`, `F16`, `BF16`; never `F64`) are cast to `dtype`, so
//!   the GEMM runs in 16 bits with f32 accumulation (cuBLAS `CUBLAS_COMPUTE_32F` on CUDA, f32
//!   kernels on the CPU) and the output has `dtype`;
//! - **f32** (`softmax`, `log_softmax`, `layer_norm`, `sum` and what is built on it — `mean`,
//!   `sum_all`, losses' reductions — `logsumexp`, `norm`): 16-bit inputs are cast to `F32`, so
//!   the op and its output are f32;
//! - **promote** (elementwise binary ops such as a bias `add` or a residual sum): when the two
//!   float inputs differ (a 16-bit matmul output plus an f32 bias), both run in `F32`, the
//!   widest, as PyTorch's type promotion does;
//! - **`batch_norm`** is on no list (as in PyTorch): a 16-bit input keeps its dtype and is
//!   normalised in f32 with the f32 weight, bias and running statistics, as cuDNN's batch norm
//!   does; the output is 16-bit, the running statistics are updated in f32 and the weight/bias
//!   gradients are f32, so a conv → batch_norm → relu → max-pool chain stays 16-bit until a
//!   promoting or f32-list op;
//! - every other op runs in its inputs' dtype (PyTorch's "fallthrough" behaviour).
//!
//! The casts are ordinary differentiable `to_dtype` ops, so gradients flow back to the f32
//! parameters in their own dtype. The scope is thread-local: [`AutocastGuard`] (RAII, restores
//! the previous state when dropped, so scopes nest) or the closure form [`autocast`]. It works
//! the same on every device, the CPU included (slower there, but correct).

use std::cell::Cell;
use std::marker::PhantomData;

use crate::error::dtype_err;
use crate::{DType, Result, Tensor};

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The autocast dtype in effect on this thread, `None` outside any scope.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|a| a.get())
}

/// Sets this thread's autocast dtype and returns the previous one (the guards here, and
/// `cpu_pool.rs`, which restores it itself).
pub(crate) fn replace_autocast(dtype: Option<DType>) -> Option<DType> {
    AUTOCAST.with(|a| a.replace(dtype))
}

/// An autocast scope on this thread until dropped (then the previous state is restored).
#[must_use = "autocast ends as soon as the guard is dropped"]
pub struct AutocastGuard {
    previous: Option<DType>,
    _not_send: PhantomData<*const ()>,
}

impl AutocastGuard {
    /// Starts autocasting to `dtype` (`DType::BF16` or `DType::F16`).
    pub fn new(dtype: DType) -> Result<Self> {
        if !matches!(dtype, DType::BF16 | DType::F16) {
            return Err(dtype_err(
                "autocast",
                format!(
                    "autocast casts to a 16-bit float, got {dtype}; use DType::BF16 or DType::F16"
                ),
            ));
        }
        Ok(AutocastGuard {
            previous: replace_autocast(Some(dtype)),
            _not_send: PhantomData,
        })
    }

    /// Turns autocast off until dropped (PyTorch's `autocast(enabled=False)` inside a scope).
    pub fn disabled() -> Self {
        AutocastGuard {
            previous: replace_autocast(None),
            _not_send: PhantomData,
        }
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        AUTOCAST.with(|a| a.set(self.previous));
    }
}

/// Runs `f` with autocast to `dtype` on this thread.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> Result<R> {
    let _guard = AutocastGuard::new(dtype)?;
    Ok(f())
}

/// Under autocast, `t` cast to the autocast dtype when it is eligible (`F32`/`F16`/`BF16`) and
/// not already there; `None` when nothing changes.
pub(crate) fn lower(t: &Tensor) -> Result<Option<Tensor>> {
    match autocast_dtype() {
        Some(dt)
            if t.dtype() != dt && matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) =>
        {
            Ok(Some(t.to_dtype(dt)?))
        }
        _ => Ok(None),
    }
}

/// `lower` of each input; `None` when none changes.
pub(crate) fn lower_all(ts: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    let cast: Vec<Option<Tensor>> = ts.iter().map(|t| lower(t)).collect::<Result<_>>()?;
    if cast.iter().all(Option::is_none) {
        return Ok(None);
    }
    Ok(Some(
        cast.into_iter()
            .zip(ts)
            .map(|(c, t)| c.unwrap_or_else(|| (*t).clone()))
            .collect(),
    ))
}

/// Under autocast, a 16-bit `t` cast to `F32`; `None` otherwise.
pub(crate) fn to_f32(t: &Tensor) -> Result<Option<Tensor>> {
    match autocast_dtype() {
        Some(_) if matches!(t.dtype(), DType::F16 | DType::BF16) => {
            Ok(Some(t.to_dtype(DType::F32)?))
        }
        _ => Ok(None),
    }
}

/// Under autocast, `a` and `b` both cast to `F32` when they are floats of different dtypes
/// (`F32`/`F16`/`BF16`); `None` when nothing changes.
pub(crate) fn promote_pair(a: &Tensor, b: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    let float = |t: &Tensor| matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16);
    if autocast_dtype().is_none() || a.dtype() == b.dtype() || !float(a) || !float(b) {
        return Ok(None);
    }
    Ok(Some((a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?)))
}
