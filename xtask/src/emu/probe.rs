//! `xtask emu-probe CASE [--bug]`: small launcher programs for the planted-bug harness
//! ([`super::mutants`]), run under the emulator. Each launches kiln's own `kiln_fill_f32` kernel
//! (compiled through kiln-device's loader) or allocates through kiln, the way a launcher does,
//! and checks the result; `--bug` plants one launcher bug that no kernel-source change can
//! express (a wrong length, a host pointer, a grid over the limit, a read before the stream
//! finished, an allocation over capacity).
//!
//! Invariants: without `--bug` every case must succeed on a correct driver (the harness checks
//! that first, so a case that fails anyway proves nothing); a case reports failure by its exit
//! status and one `probe <case>: ...` line naming the kernel or call, never by a panic; device
//! memory of the launch cases is taken straight from the driver (`cuMemAlloc`), not from kiln's
//! caching allocator, so its end is the allocation's end.

use std::ffi::c_void;

use kiln_device::cuda::cudarc::driver::{result, sys, LaunchConfig, PushKernelArg};
use kiln_device::cuda::kernels::load_function;
use kiln_device::Device;

/// The probe cases: name and what `--bug` plants.
pub const CASES: [(&str, &str); 5] = [
    (
        "oob-store",
        "kiln_fill_f32 launched with one element more than the buffer holds",
    ),
    (
        "host-pointer",
        "a host buffer's address passed to kiln_fill_f32 as dst",
    ),
    (
        "grid-limit",
        "kiln_fill_f32 launched with gridDim.y = 65536 (limit 65535)",
    ),
    (
        "unsynced-read",
        "the host reads kiln_fill_f32's output without synchronising its stream",
    ),
    ("over-capacity", "a tensor larger than the device's memory"),
];

/// Elements of the launch cases' buffer: a multiple of 64, so the buffer ends exactly where
/// the driver's allocation (256-byte granules) ends.
const N: usize = 1 << 16;

/// Runs `xtask emu-probe CASE [--bug]`; the result is the exit status.
pub fn run(args: &[String]) -> Result<i32, String> {
    let bug = args.iter().any(|a| a == "--bug");
    let case = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .ok_or_else(|| format!("emu-probe: which case? one of {:?}", names()))?;
    let outcome = match case.as_str() {
        "oob-store" => oob_store(bug),
        "host-pointer" => host_pointer(bug),
        "grid-limit" => grid_limit(bug),
        "unsynced-read" => unsynced_read(bug),
        "over-capacity" => over_capacity(bug),
        other => {
            return Err(format!(
                "emu-probe: unknown case `{other}`; one of {:?}",
                names()
            ))
        }
    };
    match outcome {
        Ok(what) => {
            println!("probe {case}: ok ({what})");
            Ok(0)
        }
        Err(e) => {
            println!("probe {case}: FAILED: {e}");
            Ok(1)
        }
    }
}

fn names() -> Vec<&'static str> {
    CASES.iter().map(|(name, _)| *name).collect()
}

/// A driver buffer of `N` f32 zeros on cuda:0, freed on drop.
struct DeviceBuffer(sys::CUdeviceptr);

impl DeviceBuffer {
    fn zeros() -> Result<DeviceBuffer, String> {
        // SAFETY: kiln's context is current on this thread (bound by the caller's `setup`); the
        // allocation is freed once, in `drop`.
        let ptr =
            unsafe { result::malloc_sync(N * 4) }.map_err(|e| format!("cuMemAlloc: {e:?}"))?;
        // SAFETY: `ptr` holds N * 4 bytes.
        unsafe { result::memset_d8_sync(ptr, 0, N * 4) }
            .map_err(|e| format!("cuMemsetD8: {e:?}"))?;
        // cuMemsetD8 is asynchronous for device memory (legacy stream), and a non-blocking
        // stream does not wait for it: without this wait the zeros could land after the fill
        // (the emulator's --delay showed exactly that race in this probe's first version).
        result::ctx::synchronize().map_err(|e| format!("cuCtxSynchronize: {e:?}"))?;
        Ok(DeviceBuffer(ptr))
    }

    /// The buffer read back with a plain `cuMemcpyDtoH` (which waits for no other stream).
    fn read(&self) -> Result<Vec<f32>, String> {
        let mut host = vec![0f32; N];
        // SAFETY: both sides hold N f32.
        unsafe { result::memcpy_dtoh_sync(&mut host, self.0) }
            .map_err(|e| format!("cuMemcpyDtoH: {e:?}"))?;
        Ok(host)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `zeros`, freed once.
        let _ = unsafe { result::free_sync(self.0) };
    }
}

type Setup = (
    std::sync::Arc<kiln_device::cuda::cudarc::driver::CudaContext>,
    kiln_device::cuda::cudarc::driver::CudaFunction,
);

/// cuda:0's context (current on this thread) and kiln's `kiln_fill_f32`.
fn setup() -> Result<Setup, String> {
    let ctx = kiln_device::cuda::context(Device::Cuda(0)).map_err(|e| e.to_string())?;
    ctx.bind_to_thread()
        .map_err(|e| format!("cuCtxSetCurrent: {e:?}"))?;
    let fill = kiln_device::ops::fill::cuda::FILL_KERNELS;
    let function = load_function(&ctx, &fill, "kiln_fill_f32").map_err(|e| e.to_string())?;
    Ok((ctx, function))
}

/// Launches `kiln_fill_f32(dst, 1.0, n)` on `stream` with `grid` blocks of 256.
fn launch_fill(
    stream: &kiln_device::cuda::cudarc::driver::CudaStream,
    function: &kiln_device::cuda::cudarc::driver::CudaFunction,
    dst: u64,
    n: u64,
    grid: (u32, u32, u32),
) -> Result<(), String> {
    let value = 1.0f32;
    let config = LaunchConfig {
        grid_dim: grid,
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut builder = stream.launch_builder(function);
    builder.arg(&dst).arg(&value).arg(&n);
    // SAFETY: the arguments match `kiln_fill_f32(float*, float, u64)`; what `dst` points at is
    // the point of each probe (the emulator checks it).
    unsafe { builder.launch(config) }
        .map(|_| ())
        .map_err(|e| format!("cuLaunchKernel(kiln_fill_f32): {e:?}"))
}

fn all_ones(values: &[f32]) -> Result<(), String> {
    let wrong = values.iter().filter(|&&v| v != 1.0).count();
    if wrong == 0 {
        Ok(())
    } else {
        Err(format!(
            "host read of kiln_fill_f32's output: {wrong} of {} elements are not 1.0 yet",
            values.len()
        ))
    }
}

fn oob_store(bug: bool) -> Result<String, String> {
    let (ctx, function) = setup()?;
    let stream = ctx.default_stream();
    let buffer = DeviceBuffer::zeros()?;
    let n = if bug { N as u64 + 1 } else { N as u64 };
    launch_fill(&stream, &function, buffer.0, n, (64, 1, 1))?;
    stream
        .synchronize()
        .map_err(|e| format!("cuStreamSynchronize after kiln_fill_f32: {e:?}"))?;
    all_ones(&buffer.read()?)?;
    Ok(format!("kiln_fill_f32 wrote {n} elements"))
}

fn host_pointer(bug: bool) -> Result<String, String> {
    let (ctx, function) = setup()?;
    let stream = ctx.default_stream();
    let buffer = DeviceBuffer::zeros()?;
    let mut host = vec![0f32; N];
    let dst = if bug {
        host.as_mut_ptr() as *mut c_void as u64
    } else {
        buffer.0
    };
    launch_fill(&stream, &function, dst, N as u64, (64, 1, 1))?;
    stream
        .synchronize()
        .map_err(|e| format!("cuStreamSynchronize after kiln_fill_f32: {e:?}"))?;
    all_ones(&buffer.read()?)?;
    Ok("kiln_fill_f32 filled the device buffer".to_string())
}

fn grid_limit(bug: bool) -> Result<String, String> {
    let (ctx, function) = setup()?;
    let stream = ctx.default_stream();
    let buffer = DeviceBuffer::zeros()?;
    let grid = if bug { (1, 65536, 1) } else { (1, 65535, 1) };
    launch_fill(&stream, &function, buffer.0, N as u64, grid)?;
    stream
        .synchronize()
        .map_err(|e| format!("cuStreamSynchronize after kiln_fill_f32: {e:?}"))?;
    // Every block of a row starts at blockIdx.x == 0, so the y blocks all fill the same range.
    all_ones(&buffer.read()?)?;
    Ok(format!("grid {grid:?} launched"))
}

fn unsynced_read(bug: bool) -> Result<String, String> {
    let (ctx, function) = setup()?;
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("cuStreamCreate: {e:?}"))?;
    // A race shows only when the read wins it, so a few rounds (the emulator's random delays
    // make the order vary); any stale read fails the case.
    const ROUNDS: usize = 20;
    for _ in 0..ROUNDS {
        let buffer = DeviceBuffer::zeros()?;
        launch_fill(&stream, &function, buffer.0, N as u64, (64, 1, 1))?;
        if !bug {
            stream
                .synchronize()
                .map_err(|e| format!("cuStreamSynchronize: {e:?}"))?;
        }
        let values = buffer.read()?;
        stream
            .synchronize()
            .map_err(|e| format!("cuStreamSynchronize: {e:?}"))?;
        all_ones(&values)?;
    }
    Ok(format!("{ROUNDS} reads after the stream finished"))
}

fn over_capacity(bug: bool) -> Result<String, String> {
    let device = Device::Cuda(0);
    let total = device.memory_info().map_err(|e| e.to_string())?.total;
    let bytes = if bug { total + (64 << 20) } else { total / 4 };
    let elements = (bytes / 4) as usize;
    let tensor = kiln_autograd::Tensor::zeros(&[elements], kiln_device::DType::F32, device)
        .map_err(|e| format!("Tensor::zeros([{elements}], f32, cuda:0): {e}"))?;
    drop(tensor);
    Ok(format!("{bytes} bytes allocated and freed"))
}
