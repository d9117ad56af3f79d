//! Top-k along the last dim: the `k` largest (or smallest) elements of every row and their
//! positions in the row, for inference without a host sort (kiln-autograd moves any other dim
//! last with a transpose view, as for softmax).
//!
//! Invariants, shared by the CPU and CUDA kernels so both give the same answer bit for bit:
//! - the order is total: NaN ranks above every number (PyTorch's topk puts NaN first for
//!   `largest` and last otherwise), then values compare as numbers, and equal values rank by
//!   position, the lower first; so the result is unique, whatever the kernel's schedule;
//! - outputs are contiguous, the view's leading dims then `k`: values in the input's dtype,
//!   indices `I64`, each row sorted from the best element down (largest first for `largest`,
//!   smallest first otherwise);
//! - `k` is at most the last dim (0 gives empty outputs); a 0-d view is one row of one element.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::ops::buffer::BufferOps;
use crate::ops::KernelError;
use crate::seam::seam_trait;
use crate::{DType, Error, Layout, Result};

seam_trait! {
    /// Top-k along the last dim.
    pub trait TopkOps: BufferOps {
        /// The `k` largest (`largest`) or smallest elements of each row of the last dim of the
        /// view, best first, and their positions in the row (`I64`); both contiguous, of shape
        /// the view's leading dims then `k`.
        fn topk_last_dim(&self, layout: &Layout, k: usize, largest: bool) -> Result<(Self, Self)>;
    }
}

/// The rows and row length of a top-`k` over the last dim of `layout` (a 0-d view is one row
/// of one element), or the error for a `k` past the row or a dtype without an order.
pub(crate) fn rows_and_len(layout: &Layout, k: usize, dtype: DType) -> Result<(usize, usize)> {
    if matches!(dtype, DType::Bool | DType::U8) {
        return Err(Error::UnsupportedDType {
            op: "topk",
            dtype,
            hint: "topk ranks numbers; convert with to_dtype(DType::F32) or to_dtype(DType::I64) \
                   first",
        });
    }
    let d = layout.shape().last().copied().unwrap_or(1);
    if k > d {
        return Err(KernelError::InvalidShape {
            op: "topk",
            shape: layout.shape().to_vec(),
            rule: format!("k = {k} is larger than the {d} elements of the last dim; pass k <= {d}"),
        }
        .into());
    }
    let rows = layout.numel().checked_div(d).unwrap_or(0);
    Ok((rows, d))
}
