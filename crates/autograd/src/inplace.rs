//! In-place updates (`copy_`, `fill_`, `add_`, ...), for optimizers and buffers.
//!
//! Invariants: every update writes into this tensor's buffer through its layout (so every view of
//! the buffer sees it) and bumps the buffer's version, so a backward that saved the old contents
//! refuses to run instead of computing with the new ones. In-place ops do not record gradients,
//! so they refuse a tensor that requires grad while grad mode is on (wrap optimizer steps in
//! `no_grad`, as PyTorch does). A destination that is an expanded view (one place holding several
//! elements) is refused, as PyTorch refuses it. The arithmetic updates (`add_`, `sub_`, `mul_`,
//! `div_`, `mul_scalar_`, `add_scaled_`) run kiln-device's in-place kernel (`binary_into`, on
//! the CPU through the destination's layout, strided views included): no buffer the size of
//! this tensor is allocated, except for a right operand that shares this tensor's buffer (copied
//! out first) or has another dtype (computed out of place, with the usual promotion).
//! `add_scaled_` on floats is one fused kernel (`add_scaled_into`, rounded once).
//! Backward's elementwise rules (such as ReLU's, through `binary_in_place`) update in place
//! only a gradient no other handle, view or saved copy can reach (`updatable_alone_with`); the
//! `into_*` ops (`Tensor::into_relu`, `Tensor::into_add`, through `reusable_alone` and
//! `write_owned`) do the same for a tensor the caller gives up, recording the op as the
//! out-of-place one would.

use crate::autograd::grad_mode::{is_grad_enabled, no_grad};
use crate::error::shape_err;
use crate::ops::broadcast_shapes;
use crate::tensor::{fmt_shape, Tensor};
use crate::{Error, Result};
use kiln_device::prelude::*;
use kiln_device::{BinaryOp, Layout, Storage};
use std::sync::Arc;

impl Tensor {
    /// Writes `value` (broadcast to this tensor's shape) into this tensor's buffer.
    fn assign(&self, op: &'static str, value: &Tensor) -> Result<()> {
        self.write_from(op, value, |src, layout, dst, dst_layout| {
            src.copy_into(layout, dst, dst_layout)
        })
    }

    /// `self = op(self, rhs)` in place (rhs broadcast), through the in-place kernel; a right
    /// operand of another dtype is computed out of place by `fallback` and copied in.
    fn update(
        &self,
        name: &'static str,
        rhs: &Tensor,
        op: BinaryOp,
        fallback: impl FnOnce() -> Result<Tensor>,
    ) -> Result<()> {
        if rhs.dtype() != self.dtype() {
            return self.assign(name, &no_grad(fallback)?);
        }
        self.binary_in_place(name, rhs, op)
    }

    /// The checks every in-place update makes, then `write(source, its layout broadcast to this
    /// tensor's shape, this tensor's buffer, its layout)` under the buffer's write lock (which
    /// bumps the version). A source sharing this tensor's buffer is copied out first, so reading
    /// it never overlaps the write.
    fn write_from(
        &self,
        op: &'static str,
        value: &Tensor,
        write: impl FnOnce(&Storage, &Layout, &mut Storage, &Layout) -> kiln_device::Result<()>,
    ) -> Result<()> {
        self.check_writable(op, value)?;
        self.check_same_kind(op, value)?;
        self.check_broadcasts_into(op, value)?;
        let src = self.unaliased(value)?;
        let src_layout = src.layout().broadcast_to(self.shape());
        let src_storage = src.storage();
        let mut dst = self.storage_mut();
        write(&src_storage, &src_layout, &mut dst, self.layout())?;
        Ok(())
    }

    /// Refuses an update while grad mode is on and a tensor involved requires grad.
    fn check_writable(&self, op: &'static str, value: &Tensor) -> Result<()> {
        if is_grad_enabled() && (self.requires_grad() || value.requires_grad()) {
            return Err(Error::Autograd(format!(
                "{op}: in-place ops do not record gradients, and a tensor involved requires grad; \
                 run the update under no_grad (as optimizer steps do) or use the out-of-place op"
            )));
        }
        Ok(())
    }

    /// Refuses a `value` that does not broadcast to this tensor's shape, and a destination that
    /// is an expanded view (a dimension of several elements with stride 0).
    fn check_broadcasts_into(&self, op: &'static str, value: &Tensor) -> Result<()> {
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
        // A view of no elements writes nothing, so its stride-0 dims share no written place.
        let layout = self.layout();
        let expanded = layout
            .shape()
            .iter()
            .zip(layout.strides())
            .any(|(&n, &s)| n > 1 && s == 0);
        if expanded && self.numel() > 0 {
            return Err(shape_err(
                op,
                format!(
                    "the destination of shape {} is an expanded view: several of its elements \
                     share one place in memory, so an in-place write would be ambiguous; write \
                     into a contiguous copy (copy_data) instead",
                    fmt_shape(self.shape())
                ),
            ));
        }
        Ok(())
    }

    /// `value`, or a copy of it in a buffer of its own when it shares this tensor's buffer (so
    /// reading it never overlaps the write).
    fn unaliased(&self, value: &Tensor) -> Result<Tensor> {
        Ok(if value.shares_storage_with(self) {
            let copied = value.storage().copy_contiguous(value.layout())?;
            Tensor::from_storage(copied, value.shape(), None)
        } else {
            value.clone()
        })
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
        self.update("add_", other, BinaryOp::Add, || self.add(other))
    }

    /// `self += alpha * other`, in place (PyTorch's `add_(other, alpha=alpha)`). Floating
    /// tensors of one dtype take one fused multiply-add per element, rounded once, as PyTorch's
    /// kernels do (f16/bf16 computed in f32); other dtypes scale `other` first.
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<()> {
        if other.dtype() == self.dtype() && self.dtype().is_float() {
            return self.write_from("add_", other, |src, layout, dst, dst_layout| {
                src.add_scaled_into(layout, dst, dst_layout, alpha)
            });
        }
        let scaled = no_grad(|| other.mul_scalar(alpha))?;
        self.update("add_", &scaled, BinaryOp::Add, || self.add(&scaled))
    }

    /// `max(self, 0)` in place (PyTorch's `relu_`): the same values as [`Tensor::relu`] (NaN
    /// stays NaN, `-0.0` becomes `0.0`), written into this tensor's buffer.
    pub fn relu_(&self) -> Result<()> {
        if !self.relu_in_place_supported() {
            // relu's refusal (the device's unsupported-dtype error), under this op's name.
            return Err(kiln_device::Error::UnsupportedDType {
                op: "relu_",
                dtype: self.dtype(),
                hint: kiln_device::ops::FLOAT_HINT,
            }
            .into());
        }
        let zero = self.scalar_like(0.0)?;
        self.binary_in_place("relu_", &zero, BinaryOp::Maximum)
    }

    /// The dtypes `relu` computes (floats and `i64`), which the in-place kernel's `max(x, 0)`
    /// takes too.
    pub(crate) fn relu_in_place_supported(&self) -> bool {
        self.dtype().is_float() || self.dtype() == kiln_device::DType::I64
    }

    /// True when an elementwise result of `self` and `other` can be written into `self`'s
    /// buffer without anyone seeing it: `self` is [held alone](Tensor::held_alone), no graph is
    /// being built, and `other` has `self`'s dtype and shape. What backward's elementwise rules
    /// check before reusing the incoming gradient.
    pub(crate) fn updatable_alone_with(&self, other: &Tensor) -> bool {
        self.held_alone()
            && !is_grad_enabled()
            && self.dtype() == other.dtype()
            && self.shape() == other.shape()
    }

    /// This handle is the only one to the tensor and to its storage (no other tensor, view or
    /// saved copy), and the tensor is dense (not an expanded view, whose elements share places).
    fn held_alone(&self) -> bool {
        let shared = Arc::strong_count(&self.0) > 1 || Arc::strong_count(self.storage_arc()) > 1;
        !shared && self.is_contiguous()
    }

    /// True when the caller, giving this handle up, gives up the buffer with it: it is [held
    /// alone](Tensor::held_alone), and it is not a leaf that requires grad while a graph is
    /// built (PyTorch refuses to update such a leaf in place too). What the `into_*` ops check
    /// before writing their result over it.
    pub(crate) fn reusable_alone(&self) -> bool {
        let recorded_leaf =
            is_grad_enabled() && self.requires_grad() && self.grad_fn_node().is_none();
        self.held_alone() && !recorded_leaf
    }

    /// `self = op(self, other)` (`other` broadcast, of `self`'s dtype, in another buffer) through
    /// the in-place kernel, without the checks of the public updates: for the `into_*` ops once
    /// [`Tensor::reusable_alone`] holds, which record the op themselves.
    pub(crate) fn write_owned(&self, other: &Tensor, op: BinaryOp) -> Result<()> {
        let layout = other.layout().broadcast_to(self.shape());
        let src = other.storage();
        let mut dst = self.storage_mut();
        src.binary_into(&layout, &mut dst, self.layout(), op)?;
        Ok(())
    }

    /// `self = op(self, other)` in place through the in-place kernel (`other` of `self`'s
    /// dtype), errors naming `name`: the arithmetic updates' common path, and a backward rule's
    /// once it checked [`Tensor::updatable_alone_with`].
    pub(crate) fn binary_in_place(
        &self,
        name: &'static str,
        other: &Tensor,
        op: BinaryOp,
    ) -> Result<()> {
        self.write_from(name, other, |src, layout, dst, dst_layout| {
            src.binary_into(layout, dst, dst_layout, op)
        })
    }

    /// `self -= other`, in place.
    pub fn sub_(&self, other: &Tensor) -> Result<()> {
        self.update("sub_", other, BinaryOp::Sub, || self.sub(other))
    }

    /// `self *= other`, in place.
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        self.update("mul_", other, BinaryOp::Mul, || self.mul(other))
    }

    /// `self *= value`, in place.
    pub fn mul_scalar_(&self, value: f64) -> Result<()> {
        let v = self.scalar_like(value)?;
        self.update("mul_", &v, BinaryOp::Mul, || self.mul(&v))
    }

    /// `self /= other`, in place.
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        self.update("div_", other, BinaryOp::Div, || self.div(other))
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
