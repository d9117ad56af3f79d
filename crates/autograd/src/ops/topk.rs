//! `topk` along any dim: the dim is moved last with a transpose view, kiln-device's top-k
//! kernel ranks each row (`TopkOps`, CPU or CUDA, no host sort), and the results are
//! transposed back. Invariants: indices are `I64` positions along `dim`; the order within `dim`
//! is best first (largest first for `largest`, else smallest first), NaN above every number,
//! equal values by position (the lower first); a tensor that requires grad gets its values by
//! `gather` at the indices, so the gradient flows to the selected elements (zero elsewhere).

use crate::error::shape_err;
use crate::tensor::{resolve_dim, Tensor};
use crate::Result;
use kiln_device::prelude::*;

impl Tensor {
    /// The `k` largest (`largest`) or smallest elements along `dim` and their indices (`I64`),
    /// as PyTorch's `torch.topk(x, k, dim, largest, sorted)`: both of `self`'s shape with `dim`
    /// of size `k`. kiln always returns them sorted, best first, which `sorted = false` (any
    /// order, in PyTorch) also allows; equal values come in index order, NaN ranks above every
    /// number. `k` past the size of `dim` is an error naming both, and so is any `k` but 1 on a
    /// 0-d tensor; bool and `U8` tensors have no order here (convert them first).
    pub fn topk(
        &self,
        k: usize,
        dim: isize,
        largest: bool,
        sorted: bool,
    ) -> Result<(Tensor, Tensor)> {
        let _ = sorted; // always sorted: a valid answer for either flag
        let d = resolve_dim("topk", dim, self.rank())?;
        if self.rank() == 0 {
            if k != 1 {
                // PyTorch returns the element for k = 0 too: more than asked for.
                return Err(shape_err(
                    "topk",
                    format!("a 0-d tensor holds one element, so k must be 1, got {k}"),
                ));
            }
            let (v, i) = self.unsqueeze(0)?.topk(k, 0, largest, sorted)?;
            return Ok((v.squeeze_dim(0)?, i.squeeze_dim(0)?));
        }
        let size = self.shape()[d];
        if k > size {
            return Err(shape_err(
                "topk",
                format!(
                    "k = {k} is larger than dim {d}'s {size} elements (shape {:?}); pass k <= {size}",
                    self.shape()
                ),
            ));
        }
        let last = self.rank() - 1;
        let moved = if d == last {
            self.clone()
        } else {
            self.transpose(d as isize, last as isize)?
        };
        let (values, indices) = moved.storage().topk_last_dim(moved.layout(), k, largest)?;
        let mut shape = moved.shape().to_vec();
        shape[last] = k;
        let values = Tensor::from_storage(values, &shape, None);
        let indices = Tensor::from_storage(indices, &shape, None);
        let (values, indices) = if d == last {
            (values, indices)
        } else {
            (
                values.transpose(d as isize, last as isize)?,
                indices.transpose(d as isize, last as isize)?,
            )
        };
        if self.requires_grad() {
            // The same values, read through a differentiable op.
            return Ok((self.gather(d as isize, &indices.contiguous()?)?, indices));
        }
        Ok((values, indices))
    }
}
