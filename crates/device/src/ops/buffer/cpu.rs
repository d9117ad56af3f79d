//! [`BufferOps`] for host buffers: the facts come from the buffer, and a host copy of a view is
//! its contiguous copy.

use super::BufferOps;
use crate::ops::copy::CopyOps;
use crate::{CpuStorage, DType, Device, Layout, Result};

impl BufferOps for CpuStorage {
    fn dtype(&self) -> DType {
        CpuStorage::dtype(self)
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn len(&self) -> usize {
        CpuStorage::len(self)
    }
    fn from_cpu(_device: Device, cpu: &CpuStorage) -> Result<Self> {
        Ok(cpu.clone())
    }
    fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        self.copy_contiguous(layout)
    }
}
