//! In-place updates (`copy_`, `fill_`, `add_`, ...), for optimizers and buffers.
//!
//! Each computes its result out of place and writes it into this tensor's buffer through its
//! layout (so every view of the buffer sees it), then bumps the buffer's version: a backward that
//! saved the old contents refuses to run instead of computing with the new ones. In-place ops do
//! not record gradients, so they refuse a tensor that requires grad while grad mode is on (wrap
//! optimizer steps in `no_grad`, as PyTorch does).

use crate::autograd::grad_mode::{is_grad_enabled, no_grad};
use crate::error::shape_err;
use crate::ops::broadcast_shapes;
use crate::tensor::{fmt_shape, Tensor};
use crate::{Error, Result};
use kiln_device::prelude::*;

impl Tensor {
    /// Writes `value` (broadcast to this tensor's shape) into this tensor's buffer.
    fn assign(&self, op: &'static str, value: &Tensor) -> Result<()> {
        if is_grad_enabled() && (self.requires_grad() || value.requires_grad()) {
            return Err(Error::Autograd(format!(
                "{op}: in-place ops do not record gradients, and a tensor involved requires grad; \
                 run the update under no_grad (as optimizer steps do) or use the out-of-place op"
            )));
        }
        self.check_same_kind(op, value)?;
        let shape = broadcast_shapes(op, self.shape(), value.shape())?;
        if shape != self.shape() {
            return Err(shape_err(
                op,
                format!(
                    "value of shape {} does not broadcast to the destination shape {}",
                    fmt_shape(value.shape()),
                    fmt_shape(self.shape())
                ),
            ));
        }
        // A source sharing our buffer is copied out first, so reading it never overlaps the write.
        let src = if value.shares_storage_with(self) {
            let copied = value.storage().copy_contiguous(value.layout())?;
            Tensor::from_storage(copied, value.shape(), None)
        } else {
            value.clone()
        };
        let src_layout = src.layout().broadcast_to(self.shape());
        let src_storage = src.storage();
        let mut dst = self.storage_mut();
        src_storage.copy_into(&src_layout, &mut dst, self.layout())?;
        Ok(())
    }

    /// Copies `src` (broadcast) into this tensor, in place.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.assign("copy_", src)
    }

    /// Sets every element to `value`, in place.
    pub fn fill_(&self, value: f64) -> Result<()> {
        let v = Tensor::scalar(value, self.dtype(), self.device())?;
        self.assign("fill_", &v)
    }

    /// Sets every element to zero, in place.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }

    /// `self += other`, in place.
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        self.assign("add_", &no_grad(|| self.add(other))?)
    }

    /// `self += alpha * other`, in place (PyTorch's `add_(other, alpha=alpha)`).
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<()> {
        self.assign("add_", &no_grad(|| self.add(&other.mul_scalar(alpha)?))?)
    }

    /// `self -= other`, in place.
    pub fn sub_(&self, other: &Tensor) -> Result<()> {
        self.assign("sub_", &no_grad(|| self.sub(other))?)
    }

    /// `self *= other`, in place.
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        self.assign("mul_", &no_grad(|| self.mul(other))?)
    }

    /// `self *= value`, in place.
    pub fn mul_scalar_(&self, value: f64) -> Result<()> {
        self.assign("mul_", &no_grad(|| self.mul_scalar(value))?)
    }

    /// `self /= other`, in place.
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        self.assign("div_", &no_grad(|| self.div(other))?)
    }

    /// A copy in a new buffer, differentiable (PyTorch's `clone()`; `Tensor::clone` only copies
    /// the handle).
    pub fn copy_data(&self) -> Result<Tensor> {
        let _op = crate::autograd::attribution::forward_op("CloneBackward");
        let storage = self.storage().copy_contiguous(self.layout())?;
        let node = Tensor::grad_node("CloneBackward", &[self], |_| {
            Box::new(|g| Ok(vec![Some(g.clone())]))
        });
        Ok(Tensor::from_storage(storage, self.shape(), node))
    }
}
