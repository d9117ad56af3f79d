//! Differentiable ops defined outside this crate (PyTorch's `torch.autograd.Function`).
//!
//! Crates with their own fused kernels (`kiln-losses`' softmax-cross-entropy, ...) run the
//! kernel through the backend seam on [`Tensor::storage_read`], wrap the fresh buffer with
//! [`Tensor::from_storage_contiguous`], and register it with [`Tensor::record_op`], giving the
//! backward closure. The closure owns what it saved; tensors saved with
//! [`Tensor::save_for_backward`] get the same in-place version check as built-in ops.

use crate::autograd::graph::BackwardFn;
use crate::error::shape_err;
use crate::tensor::{checked_numel, fmt_shape, Tensor};
use crate::Result;
use kiln_device::prelude::*;
use kiln_device::Storage;
use std::sync::RwLockReadGuard;

/// A backward closure: gets the output's gradient, returns one optional gradient per input (in
/// the order the inputs were given to [`Tensor::record_op`]), each of that input's shape.
pub type CustomBackward = BackwardFn;

impl Tensor {
    /// Read access to the buffer behind this tensor; read it through [`Tensor::layout`].
    pub fn storage_read(&self) -> RwLockReadGuard<'_, Storage> {
        self.storage()
    }

    /// A tensor without history over a fresh contiguous `storage` of `shape`.
    pub fn from_storage_contiguous(storage: Storage, shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel("from_storage_contiguous", shape)?;
        if storage.len() != n {
            return Err(shape_err(
                "from_storage_contiguous",
                format!(
                    "a buffer of {} elements cannot back shape {} (needs {n})",
                    storage.len(),
                    fmt_shape(shape)
                ),
            ));
        }
        Ok(Tensor::from_storage(storage, shape, None))
    }

    /// A detached handle to keep in a backward closure; backward refuses to run if the tensor
    /// is modified in place after this call (call it inside `record_op`'s `make`).
    pub fn save_for_backward(&self) -> Tensor {
        self.saved()
    }

    /// `output` (computed from `inputs` without history) re-issued as the result of a
    /// differentiable op named `name` (`"CrossEntropyBackward"`, ...). `make` is called only
    /// when grad mode is on and some input requires grad; it gets, per input, whether that input
    /// needs a gradient, and returns the backward closure. Without a node, `output` comes back
    /// unchanged.
    pub fn record_op(
        name: &'static str,
        inputs: &[&Tensor],
        output: &Tensor,
        make: impl FnOnce(&[bool]) -> CustomBackward,
    ) -> Tensor {
        let node = Tensor::grad_node(name, inputs, |needs| make(&needs));
        Tensor::with_node(&output.detach(), node)
    }
}
