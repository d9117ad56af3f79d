//! Fill and strided copy on CUDA: launches the kernels of `fill.cu` on a stream.
//!
//! Buffers are raw device pointers with their element counts (the style of
//! [`crate::CudaStorage`], whose blocks come from the caching allocator): launches are queued on
//! the stream given, which must be the stream the buffers are used on, so stream order keeps them
//! alive; nothing here waits.

use super::FillOps;
use crate::dtype::{BoolByte, Element};
use crate::ops::random::cuda::Generator;
use crate::storage::{cuda_ordinal, CudaStorage};
use crate::{DType, Device};
use std::sync::Arc;

use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use half::{bf16, f16};

use super::{StridedLayout, MAX_DIMS};
use crate::cuda::kernels::{load_function, KernelSource};
use crate::cuda::launch::launch_error;
use crate::error::{Error, Result};

/// The kernels of this op family.
pub const FILL_KERNELS: KernelSource = KernelSource {
    file: "ops/fill/fill.cu",
    source: include_str!("fill.cu"),
};

/// An element type the fill kernel is instantiated for.
pub trait FillElement: DeviceRepr + Copy {
    /// The kernel's `extern "C"` name.
    const FILL_KERNEL: &'static str;
}

macro_rules! fill_element {
    ($($t:ty => $name:literal),* $(,)?) => {
        $(impl FillElement for $t {
            const FILL_KERNEL: &'static str = $name;
        })*
    };
}

fill_element!(
    f32 => "kiln_fill_f32",
    f64 => "kiln_fill_f64",
    f16 => "kiln_fill_f16",
    bf16 => "kiln_fill_bf16",
    i32 => "kiln_fill_i32",
    i64 => "kiln_fill_i64",
    u8 => "kiln_fill_u8",
);

/// The layout as the kernel receives it (matches `struct StridedArgs` in fill.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct StridedArgs {
    shape: [u64; MAX_DIMS],
    strides: [u64; MAX_DIMS],
    ndim: u32,
    pad: u32,
}

// SAFETY: plain `#[repr(C)]` data with the same layout as the CUDA struct.
unsafe impl DeviceRepr for StridedArgs {}

// fill.cu `static_assert`s the same numbers for its struct.
const _: () = assert!(std::mem::size_of::<StridedArgs>() == 136);
const _: () = assert!(std::mem::offset_of!(StridedArgs, ndim) == 128);

const BLOCK: u32 = 256;
/// Grid cap: the kernels are grid-stride loops, so more blocks than this only add overhead.
const MAX_GRID: u64 = 65_536;

fn launch_config(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, MAX_GRID) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Writes `value` into the `n` elements of type `T` at device address `dst`, on `stream`.
///
/// # Safety
/// `dst` must point to at least `n` elements of `T` in `stream`'s context, valid until the work
/// queued on `stream` so far has run.
pub unsafe fn fill<T: FillElement>(
    stream: &Arc<CudaStream>,
    dst: u64,
    n: usize,
    value: T,
) -> Result<()> {
    let n = n as u64;
    if n == 0 {
        return Ok(());
    }
    let function = load_function(stream.context(), &FILL_KERNELS, T::FILL_KERNEL)?;
    let mut launch = stream.launch_builder(&function);
    launch.arg(&dst).arg(&value).arg(&n);
    // SAFETY: the kernel's signature is (T*, T, u64) and it writes only dst[0..n), which the
    // caller guarantees.
    unsafe { launch.launch(launch_config(n)) }.map_err(|e| launch_error(T::FILL_KERNEL, e))?;
    Ok(())
}

/// Gathers the view `layout` of the `src_len` elements of `T` at `src` into the `dst_len`
/// contiguous elements at `dst`, on `stream`.
///
/// # Safety
/// `src` and `dst` must point to at least `src_len` / `dst_len` elements of `T` in `stream`'s
/// context, valid until the work queued on `stream` so far has run.
pub unsafe fn copy_strided<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    (src, src_len): (u64, usize),
    layout: &StridedLayout,
    (dst, dst_len): (u64, usize),
) -> Result<()> {
    let n = layout.check("copy_strided", src_len, dst_len)? as u64;
    if n == 0 {
        return Ok(());
    }
    let name = match std::mem::size_of::<T>() {
        1 => "kiln_copy_strided_b1",
        2 => "kiln_copy_strided_b2",
        4 => "kiln_copy_strided_b4",
        8 => "kiln_copy_strided_b8",
        other => {
            return Err(Error::LengthMismatch {
                op: "copy_strided",
                what: format!("elements of {other} bytes have no kernel (1, 2, 4 or 8 bytes)"),
            })
        }
    };
    let mut args = StridedArgs {
        shape: [1; MAX_DIMS],
        strides: [0; MAX_DIMS],
        ndim: 0,
        pad: 0,
    };
    for (d, (&size, &stride)) in layout.shape.iter().zip(&layout.strides).enumerate() {
        args.shape[d] = size as u64;
        args.strides[d] = stride as u64;
    }
    args.ndim = layout.shape.len() as u32;
    let offset = layout.offset as u64;
    let function = load_function(stream.context(), &FILL_KERNELS, name)?;
    let mut launch = stream.launch_builder(&function);
    launch.arg(&src).arg(&offset).arg(&args).arg(&dst).arg(&n);
    // SAFETY: the signature matches fill.cu; `check` proved every index read is < src_len and
    // the kernel writes only dst[0..n) with n == dst_len; the caller vouches for the pointers.
    unsafe { launch.launch(launch_config(n)) }.map_err(|e| launch_error(name, e))?;
    Ok(())
}

impl CudaStorage {
    /// `n` elements equal to `value` converted to `dtype` (with the CPU's `from_f64`).
    pub(crate) fn full_cuda(ordinal: usize, n: usize, value: f64, dtype: DType) -> Result<Self> {
        let (stream, out) = CudaStorage::output(ordinal, n, dtype)?;
        let dst = out.device_ptr();
        // SAFETY: `out` holds n elements of `dtype` and is used on `stream`.
        unsafe {
            match dtype {
                DType::F32 => fill(&stream, dst, n, f32::from_f64(value))?,
                DType::F64 => fill(&stream, dst, n, value)?,
                DType::F16 => fill(&stream, dst, n, f16::from_f64(value))?,
                DType::BF16 => fill(&stream, dst, n, bf16::from_f64(value))?,
                DType::I64 => fill(&stream, dst, n, i64::from_f64(value))?,
                DType::U8 => fill(&stream, dst, n, u8::from_f64(value))?,
                DType::Bool => fill(&stream, dst, n, BoolByte::from_f64(value).0)?,
            }
        }
        Ok(out)
    }
}

impl FillOps for CudaStorage {
    fn full(device: Device, n: usize, value: f64, dtype: DType) -> Result<Self> {
        CudaStorage::full_cuda(cuda_ordinal(device)?, n, value, dtype)
    }

    fn arange(device: Device, start: f64, step: f64, n: usize, dtype: DType) -> Result<Self> {
        let generator = Generator::Arange { start, step };
        CudaStorage::generate_cuda(cuda_ordinal(device)?, n, dtype, generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::cuda_device_or_skip;
    use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

    fn run_fill<T: FillElement>(
        stream: &Arc<CudaStream>,
        buf: &mut CudaSlice<T>,
        value: T,
    ) -> Result<()> {
        let n = buf.len();
        let (ptr, _sync) = buf.device_ptr_mut(stream);
        // SAFETY: `buf` holds n elements and lives on `stream` past the launch.
        unsafe { fill(stream, ptr, n, value) }
    }

    fn run_copy<T: DeviceRepr>(
        stream: &Arc<CudaStream>,
        src: &CudaSlice<T>,
        layout: &StridedLayout,
        dst: &mut CudaSlice<T>,
    ) -> Result<()> {
        let (src_len, dst_len) = (src.len(), dst.len());
        let (s, _sync_src) = src.device_ptr(stream);
        let (d, _sync_dst) = dst.device_ptr_mut(stream);
        // SAFETY: the pointers hold src_len / dst_len elements and live on `stream`.
        unsafe { copy_strided::<T>(stream, (s, src_len), layout, (d, dst_len)) }
    }

    #[test]
    fn fill_cu_compiles_to_ptx_with_every_kernel() {
        let ptx = match crate::cuda::kernels::compile_ptx(&FILL_KERNELS, (9, 0)) {
            Err(Error::NvrtcNotFound) if !crate::testing::cuda_required() => {
                eprintln!(
                    "skipping fill_cu_compiles_to_ptx_with_every_kernel: libnvrtc.so not found"
                );
                return;
            }
            other => other.unwrap(),
        };
        assert!(ptx.contains(".target sm_90"), "PTX for the wrong arch");
        for name in ["f32", "f64", "f16", "bf16", "i32", "i64", "u8"] {
            assert!(
                ptx.contains(&format!(".entry kiln_fill_{name}(")),
                "kiln_fill_{name} missing"
            );
        }
        for bytes in [1, 2, 4, 8] {
            assert!(ptx.contains(&format!(".entry kiln_copy_strided_b{bytes}(")));
        }
        // Cached: the second request returns the same compiled text.
        let again = crate::cuda::kernels::compile_ptx(&FILL_KERNELS, (9, 0)).unwrap();
        assert!(std::sync::Arc::ptr_eq(&ptx, &again));
    }

    #[test]
    fn fill_matches_cpu_for_every_dtype() {
        let Some(dev) = cuda_device_or_skip() else {
            return;
        };
        let stream = crate::cuda::default_stream(dev).unwrap();
        fn check<T: FillElement + PartialEq + std::fmt::Debug + Default>(
            stream: &std::sync::Arc<cudarc::driver::CudaStream>,
            value: T,
        ) {
            // 1000 003 elements: several blocks plus a ragged tail.
            let n = 1_000_003;
            let mut buf = stream.clone_htod(&vec![T::default(); n]).unwrap();
            run_fill(stream, &mut buf, value).unwrap();
            let host = stream.clone_dtoh(&buf).unwrap();
            let mut want = vec![T::default(); n];
            super::super::cpu::fill(&mut want, value);
            assert_eq!(host, want);
        }
        check(&stream, 1.25f32);
        check(&stream, -3.5f64);
        check(&stream, f16::from_f32(0.333));
        check(&stream, bf16::from_f32(-7.0));
        check(&stream, -42i32);
        check(&stream, i64::MIN + 1);
        check(&stream, 0xA5u8);
        let mut empty = stream.alloc_zeros::<f32>(0).unwrap();
        run_fill(&stream, &mut empty, 1.0).unwrap();
    }

    #[test]
    fn strided_copy_matches_cpu() {
        let Some(dev) = cuda_device_or_skip() else {
            return;
        };
        let stream = crate::cuda::default_stream(dev).unwrap();
        let src_host: Vec<f32> = (0..24 * 5).map(|i| i as f32).collect();
        let src = stream.clone_htod(&src_host).unwrap();
        let views = [
            StridedLayout {
                shape: vec![3, 2],
                strides: vec![1, 3],
                offset: 0,
            },
            StridedLayout {
                shape: vec![2, 2, 2],
                strides: vec![12, 4, 2],
                offset: 4,
            },
            StridedLayout {
                shape: vec![4, 5],
                strides: vec![0, 1],
                offset: 7,
            },
            StridedLayout {
                shape: vec![],
                strides: vec![],
                offset: 9,
            },
            StridedLayout {
                shape: vec![2, 1, 3, 1, 2, 1, 2, 2],
                strides: vec![48, 0, 16, 0, 8, 0, 4, 1],
                offset: 3,
            },
        ];
        for view in &views {
            let mut want = vec![0f32; view.numel()];
            super::super::cpu::copy_strided(&src_host, view, &mut want).unwrap();
            let mut dst = stream.alloc_zeros::<f32>(view.numel()).unwrap();
            run_copy(&stream, &src, view, &mut dst).unwrap();
            assert_eq!(stream.clone_dtoh(&dst).unwrap(), want, "{view:?}");
        }
        let bytes: Vec<u8> = (0..=255).collect();
        let src8 = stream.clone_htod(&bytes).unwrap();
        let rev = StridedLayout {
            shape: vec![16, 16],
            strides: vec![1, 16],
            offset: 0,
        };
        let mut dst8 = stream.alloc_zeros::<u8>(256).unwrap();
        run_copy(&stream, &src8, &rev, &mut dst8).unwrap();
        let mut want8 = vec![0u8; 256];
        super::super::cpu::copy_strided(&bytes, &rev, &mut want8).unwrap();
        assert_eq!(stream.clone_dtoh(&dst8).unwrap(), want8);
        let whole = StridedLayout {
            shape: vec![120],
            strides: vec![1],
            offset: 0,
        };
        let mut all = stream.alloc_zeros::<f32>(120).unwrap();
        run_copy(&stream, &src, &whole, &mut all).unwrap();
        assert_eq!(stream.clone_dtoh(&all).unwrap(), src_host);
        let too_far = StridedLayout {
            shape: vec![2],
            strides: vec![200],
            offset: 0,
        };
        let mut two = stream.alloc_zeros::<f32>(2).unwrap();
        assert!(matches!(
            run_copy(&stream, &src, &too_far, &mut two),
            Err(Error::LengthMismatch { .. })
        ));
    }
}
