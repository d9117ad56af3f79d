//! The buffer family of the seam: what every device storage knows about itself (dtype, device,
//! length) and the copies between a device and the host; and how a [`Storage`] operand becomes
//! the storage of one device (`Lower`) and back (`Lift`).
//!
//! Invariants: `Lower` accepts a [`Storage`] operand only when it holds the receiver's device
//! type *and* sits on the receiver's device (CUDA ordinals included); anything else is
//! `Error::DeviceMismatch` naming the op, the receiver's device and the operand's. A host
//! buffer passed to a constructor (`from_cpu`) is not a `Storage` and passes unchanged.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;

use crate::seam::{mismatch, pass_through, seam_trait, Lift, Lower, OnDevice};
#[cfg(feature = "cuda")]
use crate::CudaStorage;
use crate::{CpuStorage, DType, Device, Layout, Result, Storage};

seam_trait! {
    /// A buffer of one dtype on one device: the base of every op-family trait.
    pub trait BufferOps: Sized + Send + Sync {
        /// The element type.
        fn dtype(&self) -> DType;
        /// The device holding the buffer.
        fn device(&self) -> Device;
        /// Number of elements in the buffer.
        fn len(&self) -> usize;
        /// True when the buffer has no elements.
        fn is_empty(&self) -> bool {
            self.len() == 0
        }
        /// A copy of a host buffer on `device`.
        fn from_cpu(device: Device, cpu: &CpuStorage) -> Result<Self>;
        /// The elements of `layout`, contiguous, on the host.
        fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage>;
    }
}

impl Storage {
    /// A copy of this storage's `layout` elements on `device`, contiguous.
    pub fn to_device(&self, layout: &Layout, device: Device) -> Result<Storage> {
        let host = self.to_cpu(layout)?;
        Storage::from_cpu(device, &host)
    }
}

pass_through!(ref CpuStorage);

impl Lift<CpuStorage> for CpuStorage {
    fn lift(self) -> CpuStorage {
        self
    }
}

impl Lift<Storage> for CpuStorage {
    fn lift(self) -> Storage {
        Storage::Cpu(self)
    }
}

impl<'a> Lower<CpuStorage> for &'a Storage {
    type Out = &'a CpuStorage;
    fn lower(self, op: &'static str, device: Device) -> Result<&'a CpuStorage> {
        match self {
            Storage::Cpu(s) => Ok(s),
            #[allow(unreachable_patterns)]
            other => Err(mismatch(op, device, other.device())),
        }
    }
}

impl<'a> Lower<CpuStorage> for &'a mut Storage {
    type Out = &'a mut CpuStorage;
    fn lower(self, op: &'static str, device: Device) -> Result<&'a mut CpuStorage> {
        match self {
            Storage::Cpu(s) => Ok(s),
            #[allow(unreachable_patterns)]
            other => Err(mismatch(op, device, other.device())),
        }
    }
}

#[cfg(feature = "cuda")]
impl Lift<Storage> for CudaStorage {
    fn lift(self) -> Storage {
        Storage::Cuda(self)
    }
}

#[cfg(feature = "cuda")]
impl<'a> Lower<CudaStorage> for &'a Storage {
    type Out = &'a CudaStorage;
    fn lower(self, op: &'static str, device: Device) -> Result<&'a CudaStorage> {
        match self {
            Storage::Cuda(s) if s.device() == device => Ok(s),
            other => Err(mismatch(op, device, other.device())),
        }
    }
}

#[cfg(feature = "cuda")]
impl<'a> Lower<CudaStorage> for &'a mut Storage {
    type Out = &'a mut CudaStorage;
    fn lower(self, op: &'static str, device: Device) -> Result<&'a mut CudaStorage> {
        let rhs = self.device();
        match self {
            Storage::Cuda(s) if rhs == device => Ok(s),
            _ => Err(mismatch(op, device, rhs)),
        }
    }
}

impl<T: BufferOps> OnDevice for T {
    fn on_device(&self) -> Device {
        self.device()
    }
}
