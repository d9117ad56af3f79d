//! Direct buffer access for fused multi-tensor kernels (optimizer steps, gradient clipping).
//!
//! Ordinary ops never hand out their buffers. Fused kernels that update many tensors in one
//! parallel pass (`kiln-optim`) need the flat buffer behind each tensor instead: they read
//! inputs through [`Tensor::storage_read`] and write outputs through [`Tensor::storage_write`],
//! which bumps the version counter like every in-place op (or through
//! [`Tensor::storage_write_unmarked`], which leaves that to [`Tensor::mark_written`] once a pass
//! that may write nothing has written). [`Tensor::storage_key`] identifies
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
        check_may_write(self)?;
        Ok(self.storage_mut())
    }

    /// Write access that leaves the buffer's version alone, for a fused pass that reads a list
    /// first and may then write none of it (a gradient clip whose coefficient turns out to be
    /// 1 must not look like an in-place change to a backward that saved a gradient). Call
    /// [`Tensor::mark_written`] once the pass has written through the guard; refused like
    /// [`Tensor::storage_write`].
    pub fn storage_write_unmarked(&self) -> Result<RwLockWriteGuard<'_, Storage>> {
        check_may_write(self)?;
        Ok(self.storage_lock_write())
    }

    /// Records an in-place change of the buffer (bumps its version, as every in-place op
    /// does), after writing through [`Tensor::storage_write_unmarked`].
    pub fn mark_written(&self) {
        self.bump_version();
    }

    /// An id of the buffer behind this tensor, equal for every view of the same buffer.
    pub fn storage_key(&self) -> usize {
        Arc::as_ptr(self.storage_arc()) as *const u8 as usize
    }
}

/// Refuses raw writes to a tensor that requires grad while grad mode is on.
fn check_may_write(t: &Tensor) -> Result<()> {
    if is_grad_enabled() && t.requires_grad() {
        return Err(Error::Autograd(
            "storage_write: in-place writes do not record gradients and this tensor requires \
             grad; run the update under no_grad (as optimizer steps do)"
                .into(),
        ));
    }
    Ok(())
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
        drop(t.storage_write_unmarked().unwrap());
        assert_eq!(
            t.version(),
            before + 1,
            "unmarked access leaves the version"
        );
        t.mark_written();
        assert_eq!(t.version(), before + 2);
        t.set_requires_grad(true).unwrap();
        assert!(t.storage_write().is_err());
        assert!(t.storage_write_unmarked().is_err());
        no_grad(|| assert!(t.storage_write().is_ok()));
        no_grad(|| assert!(t.storage_write_unmarked().is_ok()));
    }
}
