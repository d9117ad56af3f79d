//! Direct buffer access for fused multi-tensor kernels (optimizer steps, gradient clipping).
//!
//! Ordinary ops never hand out their buffers. Fused kernels that update many tensors in one
//! parallel pass (`kiln-optim`) need the flat buffer behind each tensor instead: they read
//! inputs through [`Tensor::storage_read`] and write outputs through [`Tensor::storage_write`],
//! which bumps the version counter like every in-place op. [`Tensor::storage_key`] identifies
//! the shared buffer, so a caller can refuse, or route elsewhere, two tensors that view the same
//! buffer before taking two guards on it (a second write guard on one buffer would deadlock).

use crate::autograd::grad_mode::is_grad_enabled;
use crate::tensor::Tensor;
use crate::{Error, Result};
use kiln_device::Storage;
use std::sync::{Arc, RwLockWriteGuard};

impl Tensor {
    /// Write access to the whole buffer behind this tensor, for an in-place kernel; bumps the
    /// buffer's version. Refused for a tensor that requires grad while grad mode is on (run
    /// optimizer updates under `no_grad`, as PyTorch does).
    pub fn storage_write(&self) -> Result<RwLockWriteGuard<'_, Storage>> {
        if is_grad_enabled() && self.requires_grad() {
            return Err(Error::Autograd(
                "storage_write: in-place writes do not record gradients and this tensor requires \
                 grad; run the update under no_grad (as optimizer steps do)"
                    .into(),
            ));
        }
        Ok(self.storage_mut())
    }

    /// An id of the buffer behind this tensor, equal for every view of the same buffer.
    pub fn storage_key(&self) -> usize {
        Arc::as_ptr(self.storage_arc()) as *const u8 as usize
    }
}

#[cfg(test)]
mod tests {
    use crate::{no_grad, Device, Tensor};

    #[test]
    fn views_share_a_key_and_writes_bump_the_version() {
        let t = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], &[2, 2], Device::Cpu).unwrap();
        let v = t.narrow(0, 1, 1).unwrap();
        let other = Tensor::zeros(&[2], kiln_device::DType::F32, Device::Cpu).unwrap();
        assert_eq!(t.storage_key(), v.storage_key());
        assert_ne!(t.storage_key(), other.storage_key());
        let before = t.version();
        drop(t.storage_write().unwrap());
        assert_eq!(t.version(), before + 1);
        t.set_requires_grad(true).unwrap();
        assert!(t.storage_write().is_err());
        no_grad(|| assert!(t.storage_write().is_ok()));
    }
}
