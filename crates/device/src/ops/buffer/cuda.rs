//! [`BufferOps`] for CUDA buffers: copies between the host and a device go through
//! [`CudaStorage::from_host`] / [`CudaStorage::to_host`]; a view is gathered on the device first,
//! so only its elements cross the bus.

use super::BufferOps;
use crate::ops::copy::CopyOps;
use crate::{CpuStorage, CudaStorage, DType, Device, Layout, Result};

impl BufferOps for CudaStorage {
    fn dtype(&self) -> DType {
        CudaStorage::dtype(self)
    }
    fn device(&self) -> Device {
        CudaStorage::device(self)
    }
    fn len(&self) -> usize {
        CudaStorage::len(self)
    }
    fn from_cpu(device: Device, cpu: &CpuStorage) -> Result<Self> {
        CudaStorage::from_host(crate::storage::cuda_ordinal(device)?, cpu)
    }
    fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        if self.layout_is_whole(layout) {
            self.to_host()
        } else {
            self.to_dtype(layout, self.dtype())?.to_host()
        }
    }
}
