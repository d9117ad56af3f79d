//! The CUDA implementation of the multi-tensor family: launchers for `multi_tensor.cu` (the
//! tables every kernel reads, global-norm clipping here, the optimizer steps and unscale in
//! `cuda/`), and `MultiTensorOps for CudaStorage` in `cuda/family.rs`.
//!
//! A [`ClipPlan`] is built once per parameter set: it uploads the tensor table and the chunk
//! table and allocates the per-chunk partials and the ticket counter. [`ClipPlan::norm`] and
//! [`ClipPlan::scale`] then each enqueue one kernel on the stream, for any number of tensors,
//! writing and reading a two-float `[total_norm, clip_coef]` buffer the caller owns; neither
//! waits for the device. [`ClipPlan::matches`] tells a caller whether the cached plan still
//! describes its tensors (same pointers, lengths and dtypes), so the tables are rebuilt only
//! when the set changes.
//!
//! Invariants: the `#[repr(C)]` table entries match the `.cu` structs (sizes and offsets are
//! asserted on both sides); every launch is queued on the stream kiln's storages of that device
//! use, so stream order alone orders it after the writes of its inputs; table indexes are u32,
//! and a list needing more is refused with [`Error::Unsupported`] before anything is uploaded.

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{plan_chunks, NormKind, CHUNK_ELEMS};
use crate::cuda::driver_error;
use crate::cuda::kernels::{load_function, KernelSource};
use crate::error::{Error, Result};
use crate::DType;

mod adam;
mod family;
mod sgd;
mod unscale;
pub use adam::{adam_step_f32, AdamConstants, AdamTensor};
pub use sgd::{sgd_step_f32, SgdConstants, SgdTensor};
pub use unscale::{unscale_and_check, FoundInfFlag};

/// The kernels of this op family.
pub const MULTI_TENSOR_KERNELS: KernelSource = KernelSource {
    file: "ops/multi_tensor/multi_tensor.cu",
    source: include_str!("../multi_tensor.cu"),
};

/// One tensor as the kernels see it: a device address, a length in elements and a dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTensor {
    /// Device address of the first element.
    pub ptr: u64,
    /// Number of elements.
    pub len: u64,
    /// Element type (F32, F64, F16 or BF16).
    pub dtype: DType,
}

/// Matches `struct KilnMtTensor` in multi_tensor.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct TensorEntry {
    ptr: u64,
    len: u64,
    dtype: u32,
    first_chunk: u32,
    num_chunks: u32,
    pad: u32,
}

/// Matches `struct KilnMtChunk` in multi_tensor.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ChunkEntry {
    start: u64,
    len: u64,
    tensor: u32,
    pad: u32,
}

// SAFETY: plain `#[repr(C)]` data laid out like the CUDA structs.
unsafe impl DeviceRepr for TensorEntry {}
// SAFETY: as above.
unsafe impl DeviceRepr for ChunkEntry {}

// multi_tensor.cu `static_assert`s the same sizes and offsets for its structs.
const _: () = assert!(std::mem::size_of::<TensorEntry>() == 32);
const _: () = assert!(std::mem::offset_of!(TensorEntry, dtype) == 16);
const _: () = assert!(std::mem::size_of::<ChunkEntry>() == 24);
const _: () = assert!(std::mem::offset_of!(ChunkEntry, tensor) == 16);

const THREADS: u32 = 256;
/// Most blocks launched; blocks stride over the chunk table beyond this.
const MAX_BLOCKS: usize = 4096;

fn dtype_code(dtype: DType) -> Result<u32> {
    Ok(match dtype {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::F16 => 2,
        DType::BF16 => 3,
        other => {
            return Err(Error::UnsupportedDType {
                op: "clip_grad_norm_",
                dtype: other,
                hint: "gradients are floating point; convert with to_dtype(DType::F32)",
            })
        }
    })
}

/// Device-side tables and buffers for clipping one fixed list of tensors.
#[derive(Debug)]
pub struct ClipPlan {
    stream: Arc<CudaStream>,
    key: Vec<DeviceTensor>,
    tensors: CudaSlice<TensorEntry>,
    chunks: CudaSlice<ChunkEntry>,
    num_chunks: u32,
    partials: CudaSlice<f32>,
    ticket: CudaSlice<u32>,
}

/// The error for a list whose chunks or tensors do not fit the kernels' u32 table indexes.
fn too_many() -> Error {
    Error::Unsupported {
        what: "a multi-tensor list of more than 2^32 chunks or tensors on one CUDA device",
    }
}

impl ClipPlan {
    /// Uploads the tables for `list` on `stream`.
    pub fn new(stream: &Arc<CudaStream>, list: &[DeviceTensor]) -> Result<Self> {
        let lens: Vec<usize> = list.iter().map(|t| t.len as usize).collect();
        let plan = plan_chunks(&lens, CHUNK_ELEMS);
        let num_chunks = u32::try_from(plan.len()).map_err(|_| too_many())?;
        u32::try_from(list.len()).map_err(|_| too_many())?;
        let mut entries = Vec::with_capacity(list.len());
        let mut first = 0u32;
        for (i, t) in list.iter().enumerate() {
            let n = plan.iter().filter(|c| c.tensor == i).count() as u32;
            entries.push(TensorEntry {
                ptr: t.ptr,
                len: t.len,
                dtype: dtype_code(t.dtype)?,
                first_chunk: first,
                num_chunks: n,
                pad: 0,
            });
            first += n;
        }
        let chunk_entries: Vec<ChunkEntry> = plan
            .iter()
            .map(|c| ChunkEntry {
                start: c.start as u64,
                len: c.len as u64,
                tensor: c.tensor as u32,
                pad: 0,
            })
            .collect();
        let upload = |e| driver_error("cuMemcpyHtoD", e);
        // Zero-length device buffers are not allowed; keep at least one slot.
        let tensors = if entries.is_empty() {
            stream
                .clone_htod(&[TensorEntry {
                    ptr: 0,
                    len: 0,
                    dtype: 0,
                    first_chunk: 0,
                    num_chunks: 0,
                    pad: 0,
                }])
                .map_err(upload)?
        } else {
            stream.clone_htod(&entries).map_err(upload)?
        };
        let chunks = if chunk_entries.is_empty() {
            stream
                .clone_htod(&[ChunkEntry {
                    start: 0,
                    len: 0,
                    tensor: 0,
                    pad: 0,
                }])
                .map_err(upload)?
        } else {
            stream.clone_htod(&chunk_entries).map_err(upload)?
        };
        let alloc = |e| driver_error("cuMemAlloc", e);
        Ok(ClipPlan {
            stream: stream.clone(),
            key: list.to_vec(),
            tensors,
            chunks,
            num_chunks,
            partials: stream
                .alloc_zeros::<f32>(plan.len().max(1))
                .map_err(alloc)?,
            ticket: stream.alloc_zeros::<u32>(1).map_err(alloc)?,
        })
    }

    /// True when the plan was built for exactly this list (reuse it instead of rebuilding).
    pub fn matches(&self, list: &[DeviceTensor]) -> bool {
        self.key == list
    }

    fn config(&self) -> LaunchConfig {
        let blocks = (self.num_chunks as usize).clamp(1, MAX_BLOCKS) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Enqueues the norm kernel: writes `[total_norm, clip_coef]` to the two f32 at device
    /// address `result`.
    pub fn norm(&mut self, kind: NormKind, max_norm: f64, result: u64) -> Result<()> {
        let (code, p): (i32, f32) = match kind {
            NormKind::Zero => (0, 0.0),
            NormKind::One => (1, 1.0),
            NormKind::Two => (2, 2.0),
            NormKind::Inf => (3, 0.0),
            NormKind::NegInf => (4, 0.0),
            NormKind::P(p) => (5, p as f32),
        };
        let function = load_function(self.stream.context(), &MULTI_TENSOR_KERNELS, "kiln_mt_norm")?;
        let num_tensors = self.key.len() as u32;
        let max_norm = max_norm as f32;
        let cfg = self.config();
        let mut launch = self.stream.launch_builder(&function);
        launch
            .arg(&self.tensors)
            .arg(&num_tensors)
            .arg(&self.chunks)
            .arg(&self.num_chunks)
            .arg(&code)
            .arg(&p)
            .arg(&max_norm)
            .arg(&mut self.partials)
            .arg(&mut self.ticket)
            .arg(&result);
        // SAFETY: the argument list matches kiln_mt_norm; the tables were built from `key`, whose
        // pointers the caller guarantees stay valid until the kernel finishes, and `result` is
        // a live buffer of two f32 on this stream's device.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_error("cuLaunchKernel", e))?;
        Ok(())
    }

    /// Enqueues the scale kernel, which multiplies every tensor by the coefficient at
    /// `result[1]` (a no-op on the device when it is `>= 1`).
    pub fn scale(&mut self, result: u64) -> Result<()> {
        let function = load_function(
            self.stream.context(),
            &MULTI_TENSOR_KERNELS,
            "kiln_mt_scale",
        )?;
        let cfg = self.config();
        let mut launch = self.stream.launch_builder(&function);
        launch
            .arg(&self.tensors)
            .arg(&self.chunks)
            .arg(&self.num_chunks)
            .arg(&result);
        // SAFETY: as for `norm`; the kernel writes only elements listed in the tables.
        unsafe { launch.launch(cfg) }.map_err(|e| driver_error("cuLaunchKernel", e))?;
        Ok(())
    }
}

/// The chunk table of tensors of lengths `lens`, and its length as the
/// kernels' u32 index.
fn chunk_table(lens: &[usize]) -> Result<(Vec<ChunkEntry>, u32)> {
    let plan = plan_chunks(lens, CHUNK_ELEMS);
    let num_chunks = u32::try_from(plan.len()).map_err(|_| too_many())?;
    let entries = plan
        .iter()
        .map(|c| ChunkEntry {
            start: c.start as u64,
            len: c.len as u64,
            tensor: c.tensor as u32,
            pad: 0,
        })
        .collect();
    Ok((entries, num_chunks))
}

/// One block per chunk, at most [`MAX_BLOCKS`] (blocks stride over the rest).
fn chunk_launch_config(num_chunks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((num_chunks as usize).clamp(1, MAX_BLOCKS) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Runs `f` with the [`ClipPlan`] of `list` on `cuda:ordinal`, building it (on the stream
/// kiln's storages use) only when the cached plan describes another list: the tables are
/// uploaded once and reused while the parameter set is unchanged.
pub fn with_clip_plan<R>(
    ordinal: usize,
    list: &[DeviceTensor],
    f: impl FnOnce(&mut ClipPlan) -> Result<R>,
) -> Result<R> {
    static PLANS: Mutex<Option<HashMap<usize, ClipPlan>>> = Mutex::new(None);
    let mut plans = PLANS.lock().unwrap_or_else(|p| p.into_inner());
    let plans = plans.get_or_insert_with(HashMap::new);
    let stale = plans.get(&ordinal).is_none_or(|p| !p.matches(list));
    if stale {
        let stream = crate::storage::cuda_stream(ordinal)?;
        plans.insert(ordinal, ClipPlan::new(&stream, list)?);
    }
    match plans.get_mut(&ordinal) {
        Some(plan) => f(plan),
        None => Err(Error::CudaUnavailable(format!(
            "cuda:{ordinal}: the clip plan could not be cached"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::cuda_device_or_skip;
    use cudarc::driver::DevicePtr;

    #[test]
    fn multi_tensor_cu_compiles_with_both_kernels() {
        let ptx = match crate::cuda::kernels::compile_ptx(&MULTI_TENSOR_KERNELS, (8, 0)) {
            Err(Error::NvrtcNotFound) if !crate::testing::cuda_required() => {
                eprintln!("skipping multi_tensor_cu_compiles_with_both_kernels: no libnvrtc.so");
                return;
            }
            other => other.unwrap(),
        };
        assert!(ptx.contains(".entry kiln_mt_norm("));
        assert!(ptx.contains(".entry kiln_mt_scale("));
        assert!(ptx.contains(".entry kiln_mt_adam_f32("));
        assert!(ptx.contains(".entry kiln_mt_sgd_f32("));
        assert!(ptx.contains(".entry kiln_mt_unscale("));
    }

    #[test]
    fn adamw_step_on_the_device_follows_the_formula() {
        let Some(dev) = cuda_device_or_skip() else {
            return;
        };
        let stream = crate::cuda::default_stream(dev).unwrap();
        let n = 70_001usize;
        let p0: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
        let g0: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
        let p = stream.clone_htod(&p0).unwrap();
        let g = stream.clone_htod(&g0).unwrap();
        let m = stream.alloc_zeros::<f32>(n).unwrap();
        let v = stream.alloc_zeros::<f32>(n).unwrap();
        let addr = |s: &CudaSlice<f32>| s.device_ptr(&stream).0;
        let (lr, wd, b1, b2, eps) = (0.01f64, 0.1f64, 0.9f64, 0.999f64, 1e-8f64);
        let t = AdamTensor {
            param: addr(&p),
            grad: addr(&g),
            exp_avg: addr(&m),
            exp_avg_sq: addr(&v),
            max_exp_avg_sq: 0,
            len: n as u64,
            step_size: (lr / (1.0 - b1)) as f32,
            bias_correction2_sqrt: (1.0 - b2).sqrt() as f32,
        };
        let k = AdamConstants {
            beta1_weight: (1.0 - b1) as f32,
            beta2: b2 as f32,
            beta2_weight: (1.0 - b2) as f32,
            eps: eps as f32,
            weight_decay: wd as f32,
            decay: (1.0 - lr * wd) as f32,
            grad_scale: 1.0,
            l2: false,
            decoupled: true,
        };
        adam_step_f32(&stream, &[t], &k, None).unwrap();
        let got = stream.clone_dtoh(&p).unwrap();
        for i in [0, 1, 4, n - 1] {
            let (p, g) = (f64::from(p0[i]), f64::from(g0[i]));
            // First step: m/(1-b1) = g and sqrt(v/(1-b2)) = |g|, so p moves by lr * sign(g).
            let want = p * (1.0 - lr * wd) - if g == 0.0 { 0.0 } else { lr * g.signum() };
            assert!(
                (f64::from(got[i]) - want).abs() < 1e-5,
                "{i}: {} vs {want}",
                got[i]
            );
        }
    }

    #[test]
    fn clip_on_the_device_matches_the_cpu() {
        let Some(dev) = cuda_device_or_skip() else {
            return;
        };
        let stream = crate::cuda::default_stream(dev).unwrap();
        let lens = [0usize, 1, 3, 70_001, 1000];
        let host: Vec<Vec<f32>> = lens
            .iter()
            .map(|&n| (0..n).map(|i| ((i % 17) as f32 - 8.0) * 0.25).collect())
            .collect();
        let bufs: Vec<CudaSlice<f32>> = host
            .iter()
            .map(|h| {
                if h.is_empty() {
                    stream.alloc_zeros::<f32>(1).unwrap()
                } else {
                    stream.clone_htod(h).unwrap()
                }
            })
            .collect();
        let list: Vec<DeviceTensor> = bufs
            .iter()
            .zip(&lens)
            .map(|(b, &n)| DeviceTensor {
                ptr: b.device_ptr(&stream).0,
                len: n as u64,
                dtype: DType::F32,
            })
            .collect();
        let views: Vec<super::super::cpu::FloatSlice> = host
            .iter()
            .map(|h| super::super::cpu::FloatSlice::F32(h))
            .collect();
        let norms = super::super::cpu::per_tensor_norms(&views, NormKind::Two);
        let want_total = NormKind::Two.norm_of(&norms);
        let mut plan = ClipPlan::new(&stream, &list).unwrap();
        assert!(plan.matches(&list));
        let result = stream.alloc_zeros::<f32>(2).unwrap();
        let result_address = result.device_ptr(&stream).0;
        for max_norm in [1e9, 1.0] {
            plan.norm(NormKind::Two, max_norm, result_address).unwrap();
            plan.scale(result_address).unwrap();
            let got = stream.clone_dtoh(&result).unwrap();
            stream.synchronize().unwrap();
            let [total, coef] = [got[0], got[1]];
            assert!((f64::from(total) - want_total).abs() < 1e-4 * want_total);
            let want_coef = super::super::clip_coef(max_norm, f64::from(total));
            assert!((f64::from(coef) - want_coef).abs() < 1e-6);
        }
        let after = stream.clone_dtoh(&bufs[3]).unwrap();
        let coef = 1.0 / (want_total + 1e-6);
        assert!((f64::from(after[1]) - f64::from(host[3][1]) * coef).abs() < 1e-5);
    }
}
