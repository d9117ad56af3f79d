//! [`CudaStorage`]: a device buffer on one CUDA device (behind the `cuda` feature).
//!
//! The buffer is untyped bytes plus a [`DType`], so one type covers every element type.
//!
//! **Memory comes from the device's caching allocator** ([`crate::allocator`]`(Device::Cuda(i))`,
//! over [`CudaBackend`](crate::cuda::CudaBackend)): a `CudaStorage` owns one block
//! ([`Allocation`]) and frees it on drop, back to the cache, with no driver call and no
//! synchronisation. Blocks are allocated on the stream the storage works on (the context's
//! default stream, `StreamId` 0) and every copy and kernel on them is queued on that same stream,
//! so a block freed while work on it is still queued can only be reused by work queued after it:
//! stream order keeps it safe (PyTorch's rule; `record_stream` covers other streams).
//!
//! **Raw device pointers, not `CudaSlice`.** cudarc's `CudaSlice` frees its memory itself
//! (`cuMemFreeAsync`) and tracks read/write events per buffer; wrapping an allocator block in one
//! would need `upgrade_device_ptr` + `leak` around every use, and a panic in between would free
//! the block behind the allocator's back. Instead the storage holds the block's `CUdeviceptr`
//! ([`CudaStorage::device_ptr`]): copies go through `cudarc::driver::result`
//! (`cuMemcpy*Async` on the stream), and kernels take the pointer as a plain `u64` launch
//! argument (`launch.arg(&ptr)`), which is what the pointer of a `CudaSlice` becomes anyway.
//! Empty buffers take no block (pointer 0).
//!
//! The kernels live beside their CPU twins (`crate::ops::<family>::cuda`, each implementing its
//! family's trait for `CudaStorage` and launching its `.cu` file): fill/arange/random, copies and casts,
//! elementwise ops, reductions, softmax, matmul on cuBLAS, the fused cross-entropy, and the
//! indexing ops (embedding, index_select, gather, scatter and their backward), fused batch/layer
//! norm (`norm.cu`), conv2d (im2col + cuBLAS) and 2-D pooling. Every method of
//! the seam runs on the device; nothing falls back to the host.
//! Nothing here panics when libcuda is absent (the driver library's presence is checked first).

use super::cpu::CpuStorage;
use crate::{DType, Device, Error, Layout, Result};
use cudarc::driver::{result, sys, CudaStream};
use kiln_alloc_cache::{Allocation, StreamId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A device buffer of one dtype on `Device::Cuda(ordinal)`.
#[derive(Debug)]
pub struct CudaStorage {
    /// The allocator block; `None` for an empty buffer.
    block: Option<Allocation>,
    /// Bytes of data (the block may be larger: it is rounded up).
    num_bytes: usize,
    dtype: DType,
    ordinal: usize,
}

fn cuda_err(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda {
        op,
        msg: e.to_string(),
    }
}

/// The default stream of logical device `ordinal` (in the context [`crate::cuda::context`]
/// opens for it), creating the context on first use.
pub fn stream(ordinal: usize) -> Result<Arc<CudaStream>> {
    // Keyed by ordinal in a map: an out-of-range ordinal is refused by `default_stream` (a typed
    // `NoSuchCudaDevice`) without first growing a table to its size.
    static STREAMS: OnceLock<Mutex<HashMap<usize, Arc<CudaStream>>>> = OnceLock::new();
    // SAFETY: only probes whether the dynamic library can be loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "the CUDA driver library (libcuda) was not found".into(),
        ));
    }
    let mut streams = STREAMS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(s) = streams.get(&ordinal) {
        return Ok(s.clone());
    }
    let s = crate::cuda::default_stream(Device::Cuda(ordinal))?;
    streams.insert(ordinal, s.clone());
    Ok(s)
}

/// The CUDA ordinal of `device`, or an error for the CPU.
pub(crate) fn ordinal_of(device: Device) -> Result<usize> {
    match device {
        Device::Cuda(i) => Ok(i),
        Device::Cpu => Err(Error::CudaUnavailable(
            "CudaStorage asked to live on the CPU".into(),
        )),
    }
}

impl CudaStorage {
    /// An uninitialised buffer of `num_bytes` bytes from `cuda:ordinal`'s allocator, on the
    /// stream `s`; callers fill it before handing it out.
    fn allocate(ordinal: usize, s: &CudaStream, num_bytes: usize, dtype: DType) -> Result<Self> {
        let block = if num_bytes == 0 {
            None
        } else {
            let stream = StreamId(s.cu_stream() as usize as u64);
            Some(crate::allocator(Device::Cuda(ordinal))?.allocate_static(num_bytes, stream)?)
        };
        Ok(CudaStorage {
            block,
            num_bytes,
            dtype,
            ordinal,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.num_bytes / self.dtype.size_in_bytes()
    }

    /// True when the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.num_bytes == 0
    }

    /// The device address of the first byte (0 for an empty buffer); pass it to kernels as a
    /// `u64` launch argument. Valid while `self` lives; work using it must be queued on
    /// [`stream`]`(ordinal)`.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.block.as_ref().map_or(0, Allocation::addr)
    }

    /// Bytes of data.
    pub fn num_bytes(&self) -> usize {
        self.num_bytes
    }

    /// Bytes of the allocator block behind the buffer (what it adds to `memory_allocated`).
    pub fn block_size(&self) -> usize {
        self.block.as_ref().map_or(0, Allocation::block_size)
    }

    /// Address of the allocator block behind the buffer (`None` for an empty buffer).
    pub fn block_addr(&self) -> Option<u64> {
        self.block.as_ref().map(Allocation::addr)
    }

    /// Copies a host buffer to `cuda:ordinal`.
    pub fn from_host(ordinal: usize, cpu: &CpuStorage) -> Result<Self> {
        let s = stream(ordinal)?;
        let src = cpu.as_bytes();
        let out = Self::allocate(ordinal, &s, src.len(), cpu.dtype())?;
        if !src.is_empty() {
            s.context()
                .bind_to_thread()
                .map_err(cuda_err("host-to-device copy"))?;
            // SAFETY: the block holds `src.len()` bytes; the stream is synchronised below, so
            // `src` outlives the copy.
            unsafe { result::memcpy_htod_async(out.device_ptr(), src, s.cu_stream()) }
                .map_err(cuda_err("host-to-device copy"))?;
            s.synchronize().map_err(cuda_err("host-to-device copy"))?;
        }
        Ok(out)
    }

    /// Copies the whole buffer to the host.
    pub fn to_host(&self) -> Result<CpuStorage> {
        let mut bytes = vec![0u8; self.num_bytes];
        if self.num_bytes > 0 {
            let s = stream(self.ordinal)?;
            s.context()
                .bind_to_thread()
                .map_err(cuda_err("device-to-host copy"))?;
            // SAFETY: `bytes` has room for the whole buffer; synchronised before it is read.
            unsafe { result::memcpy_dtoh_async(&mut bytes, self.device_ptr(), s.cu_stream()) }
                .map_err(cuda_err("device-to-host copy"))?;
            s.synchronize().map_err(cuda_err("device-to-host copy"))?;
            crate::cuda::deferred::report(
                self.ordinal,
                "a copy to the host (to_vec, item, to_device)",
            )?;
        }
        Ok(CpuStorage::from_bytes(&bytes, self.dtype))
    }

    /// A copy in a new block (queued on the stream; no synchronisation).
    pub fn try_clone(&self) -> Result<Self> {
        let s = stream(self.ordinal)?;
        let out = Self::allocate(self.ordinal, &s, self.num_bytes, self.dtype)?;
        if self.num_bytes > 0 {
            s.context()
                .bind_to_thread()
                .map_err(cuda_err("device-to-device copy"))?;
            // SAFETY: both blocks hold `num_bytes` bytes, are distinct, and are used on `s`.
            unsafe {
                result::memcpy_dtod_async(
                    out.device_ptr(),
                    self.device_ptr(),
                    self.num_bytes,
                    s.cu_stream(),
                )
            }
            .map_err(cuda_err("device-to-device copy"))?;
        }
        Ok(out)
    }

    /// Device address of element `element_offset` of the buffer, for the tables of
    /// multi-tensor kernels; valid while this storage lives. An offset past the buffer's end
    /// (or one whose byte count overflows) is an error, never a wrapped address.
    pub fn device_address(&self, element_offset: usize) -> Result<u64> {
        let elements = self.num_bytes / self.dtype.size_in_bytes();
        match element_offset.checked_mul(self.dtype.size_in_bytes()) {
            Some(bytes) if bytes <= self.num_bytes => Ok(self.device_ptr() + bytes as u64),
            _ => Err(Error::LengthMismatch {
                op: "device_address",
                what: format!(
                    "element offset {element_offset} lies past the end of a {elements}-element \
                     {} buffer",
                    self.dtype
                ),
            }),
        }
    }

    /// The logical CUDA ordinal of the device holding the buffer.
    pub(crate) fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// A new uninitialised output of `numel` elements of `dtype` on `ordinal`, and the stream
    /// every kernel writing it must be queued on.
    pub(crate) fn output(
        ordinal: usize,
        numel: usize,
        dtype: DType,
    ) -> Result<(Arc<CudaStream>, Self)> {
        let bytes = crate::checked_size(
            "cuda output",
            "the byte count",
            &[numel, dtype.size_in_bytes()],
        )?;
        let s = stream(ordinal)?;
        let out = Self::allocate(ordinal, &s, bytes, dtype)?;
        Ok((s, out))
    }

    /// Checks that every element `layout` reads lies inside the buffer, so no kernel reads past
    /// it (the CPU backend would panic on the slice index instead).
    pub(crate) fn check_view(&self, op: &'static str, layout: &Layout) -> Result<()> {
        let need = layout.required_len();
        if need > self.len() {
            return Err(Error::LengthMismatch {
                op,
                what: format!(
                    "the view (shape {:?}, strides {:?}, offset {}) reaches element {} of a \
                     buffer of {}",
                    layout.shape(),
                    layout.strides(),
                    layout.offset(),
                    need - 1,
                    self.len()
                ),
            });
        }
        Ok(())
    }

    /// Checks that `other` lives on the same CUDA device.
    pub(crate) fn same_device(&self, op: &'static str, other: &Self) -> Result<()> {
        if other.ordinal != self.ordinal {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: other.device(),
            });
        }
        Ok(())
    }

    /// True when `layout` covers the whole buffer in order (a copy can move it as is).
    pub(crate) fn layout_is_whole(&self, layout: &Layout) -> bool {
        layout.is_contiguous()
            && layout.offset() == 0
            && layout.numel() * self.dtype.size_in_bytes() == self.num_bytes
    }
}

impl Clone for CudaStorage {
    /// A copy in a new block. Panics when the copy fails (out of device memory, a driver error),
    /// as cloning a cudarc `CudaSlice` does; [`CudaStorage::try_clone`] returns the error.
    fn clone(&self) -> Self {
        self.try_clone()
            .unwrap_or_else(|e| panic!("cloning a cuda:{} buffer failed: {e}", self.ordinal))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absurd_ordinal_is_a_typed_error() {
        // Without a driver: CudaUnavailable; with one: NoSuchCudaDevice (the stream table used
        // to be resized to the ordinal first, which aborts on usize::MAX).
        for ordinal in [usize::MAX, 1 << 40] {
            match stream(ordinal) {
                Err(Error::CudaUnavailable(_) | Error::NoSuchCudaDevice { .. }) => {}
                other => panic!("cuda:{ordinal}: expected a typed error, got {other:?}"),
            }
        }
    }
}
