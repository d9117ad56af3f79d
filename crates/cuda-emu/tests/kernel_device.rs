//! Kernels on emulated device memory: warp operations against CUDA's documented semantics,
//! atomics across concurrently running blocks, barriers with predicates, poisoned shared memory,
//! and faults in device allocations' guard pages.

mod common;
mod runtime_support;

use cudarc::driver::sys::{CUdeviceptr, CUresult};
use kiln_cuda_emu::driver;
use runtime_support::{assert_fails, launch, load, Arg};

fn upload<T: Copy>(data: &[T]) -> CUdeviceptr {
    let bytes = std::mem::size_of_val(data);
    let p = common::alloc(bytes.max(1)).unwrap();
    let r = unsafe { driver::cuMemcpyHtoD_v2(p, data.as_ptr() as *const _, bytes) };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    // A pageable copy returns once staged (as CUDA's); these tests launch outside any stream.
    assert_eq!(
        unsafe { driver::cuCtxSynchronize() },
        CUresult::CUDA_SUCCESS
    );
    p
}

fn download<T: Copy + Default>(p: CUdeviceptr, n: usize) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let r = unsafe {
        driver::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut _, p, n * std::mem::size_of::<T>())
    };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    out
}

fn ready() -> std::sync::MutexGuard<'static, ()> {
    let guard = common::setup(&[]);
    common::bind(0);
    guard
}

#[test]
fn shuffles_follow_cudas_lane_rules_with_width() {
    let _g = ready();
    let m = load(
        "shfl.cu",
        r#"extern "C" __global__ void shfl(int* out, double* dout) {
            unsigned t = threadIdx.x;
            int v = (int)t;
            const unsigned full = 0xffffffffu;
            int* o = out + t * 6;
            o[0] = __shfl_down_sync(full, v, 3);
            o[1] = __shfl_xor_sync(full, v, 5);
            o[2] = __shfl_up_sync(full, v, 2, 16);
            o[3] = __shfl_sync(full, v, 7, 8);
            o[4] = __shfl_down_sync(full, v, 1, 8);
            o[5] = __shfl_sync(full, v, -1);
            dout[t] = __shfl_xor_sync(full, (double)t + 0.5, 16);
        }"#,
    );
    let out = common::alloc(64 * 6 * 4).unwrap();
    let dout = common::alloc(64 * 8).unwrap();
    launch(
        &m,
        "shfl",
        [1, 1, 1],
        [64, 1, 1],
        &[Arg::U64(out), Arg::U64(dout)],
    )
    .unwrap();
    let got: Vec<i32> = download(out, 64 * 6);
    let dgot: Vec<f64> = download(dout, 64);
    for t in 0..64i32 {
        let (base, lane) = (t & !31, t & 31);
        let down = |d: i32, w: i32| if (lane % w) + d < w { t + d } else { t };
        let want = [
            down(3, 32),
            base + (lane ^ 5),
            if lane % 16 >= 2 { t - 2 } else { t },
            base + (lane / 8) * 8 + 7,
            down(1, 8),
            base + 31,
        ];
        assert_eq!(
            &got[t as usize * 6..t as usize * 6 + 6],
            &want,
            "thread {t}"
        );
        assert_eq!(dgot[t as usize], (base + (lane ^ 16)) as f64 + 0.5);
    }
}

#[test]
fn ballot_any_all_and_barrier_predicates() {
    let _g = ready();
    let m = load(
        "vote.cu",
        r#"extern "C" __global__ void vote(unsigned* out) {
            unsigned t = threadIdx.x;
            unsigned* o = out + t * 6;
            o[0] = __ballot_sync(0xffffffffu, t % 3 == 0);
            o[1] = __any_sync(0xffffffffu, t == 40);
            o[2] = __all_sync(0xffffffffu, t < 60);
            o[3] = __syncthreads_count(t % 2);
            o[4] = __syncthreads_or(t == 63);
            o[5] = __syncthreads_and(t < 63);
        }"#,
    );
    let out = common::alloc(64 * 6 * 4).unwrap();
    launch(&m, "vote", [1, 1, 1], [64, 1, 1], &[Arg::U64(out)]).unwrap();
    let got: Vec<u32> = download(out, 64 * 6);
    for t in 0..64usize {
        let warp = t / 32;
        let ballot = (0..32)
            .filter(|l| (warp * 32 + l) % 3 == 0)
            .fold(0u32, |m, l| m | 1 << l);
        let want = [ballot, (warp == 1) as u32, (warp == 0) as u32, 32, 1, 0];
        assert_eq!(&got[t * 6..t * 6 + 6], &want, "thread {t}");
    }
}

#[test]
fn atomics_are_real_across_concurrent_blocks() {
    let _g = ready();
    let m = load(
        "atomics.cu",
        r#"extern "C" __global__ void count(unsigned* counter, int* maxv, float* sum) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            atomicAdd(counter, 1u);
            atomicMax(maxv, (int)i);
            atomicAdd(sum, 1.0f);
        }"#,
    );
    let counter = upload(&[0u32]);
    let maxv = upload(&[-1i32]);
    let sum = upload(&[0f32]);
    launch(
        &m,
        "count",
        [256, 1, 1],
        [128, 1, 1],
        &[Arg::U64(counter), Arg::U64(maxv), Arg::U64(sum)],
    )
    .unwrap();
    assert_eq!(download::<u32>(counter, 1)[0], 256 * 128);
    assert_eq!(download::<i32>(maxv, 1)[0], 256 * 128 - 1);
    assert_eq!(download::<f32>(sum, 1)[0], (256 * 128) as f32);
}

#[test]
fn indices_cover_3d_grids_and_blocks() {
    let _g = ready();
    let m = load(
        "idx.cu",
        r#"extern "C" __global__ void ids(unsigned* out) {
            unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
            unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
            dim3 bd = blockDim;
            out[b * bd.x * bd.y * bd.z + t] = b * 1000 + t;
        }"#,
    );
    let n = 2 * 3 * 2 * (4 * 2 * 3);
    let out = common::alloc(n * 4).unwrap();
    launch(&m, "ids", [2, 3, 2], [4, 2, 3], &[Arg::U64(out)]).unwrap();
    let got: Vec<u32> = download(out, n);
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v as usize, (i / 24) * 1000 + i % 24);
    }
}

#[test]
fn uninitialised_shared_memory_reads_as_poison() {
    let _g = ready();
    let m = load(
        "poison.cu",
        r#"extern "C" __global__ void peek(unsigned* out) {
            __shared__ unsigned sh[32];
            out[blockIdx.x * 32 + threadIdx.x] = sh[threadIdx.x];
            __syncthreads();
            sh[threadIdx.x] = 7;
        }"#,
    );
    let out = common::alloc(4 * 32 * 4).unwrap();
    launch(&m, "peek", [4, 1, 1], [32, 1, 1], &[Arg::U64(out)]).unwrap();
    assert!(download::<u32>(out, 4 * 32)
        .iter()
        .all(|&v| v == 0xffff_ffff));
}

#[test]
fn warp_mask_misuse_is_an_error_naming_the_kernel() {
    let _g = ready();
    let m = load(
        "masks.cu",
        r#"extern "C" __global__ void not_in_mask(int* out) {
            out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0);
        }
        extern "C" __global__ void lane_exited(int* out) {
            if (threadIdx.x == 31) return;
            out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1);
        }
        extern "C" __global__ void partial_warp(int* out) {
            out[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1, 1);
        }"#,
    );
    let out = common::alloc(64 * 4).unwrap();
    let code = CUresult::CUDA_ERROR_LAUNCH_FAILED;
    let run = |k| launch(&m, k, [1, 1, 1], [32, 1, 1], &[Arg::U64(out)]);
    assert_fails(
        run("not_in_mask"),
        code,
        &["kernel not_in_mask", "does not name the calling lane 16"],
    );
    assert_fails(
        run("lane_exited"),
        code,
        &["kernel lane_exited", "lane 31", "has exited"],
    );
    assert_fails(
        launch(&m, "partial_warp", [1, 1, 1], [20, 1, 1], &[Arg::U64(out)]),
        code,
        &["kernel partial_warp", "lanes this block does not have"],
    );
}

#[test]
fn stores_past_a_device_allocation_fault_naming_kernel_and_address() {
    let _g = ready();
    let m = load(
        "past_end.cu",
        r#"extern "C" __global__ void fill_past_end(float* p, unsigned n) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i <= n) p[i] = 1.0f;   // off by one
        }"#,
    );
    let n = 1024u32;
    let p = common::alloc(n as usize * 4).unwrap();
    let end = p + n as u64 * 4;
    assert_fails(
        launch(
            &m,
            "fill_past_end",
            [9, 1, 1],
            [128, 1, 1],
            &[Arg::U64(p), Arg::U32(n)],
        ),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        &[
            "kernel fill_past_end",
            "block (8,0,0) thread (0,0,0)",
            &format!("0x{end:x}"),
            "device 0",
        ],
    );
    assert_eq!(unsafe { driver::cuMemFree_v2(p) }, CUresult::CUDA_SUCCESS);
    assert_fails(
        launch(
            &m,
            "fill_past_end",
            [1, 1, 1],
            [1, 1, 1],
            &[Arg::U64(p), Arg::U32(0)],
        ),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        &["kernel fill_past_end", "argument 0"],
    );
}
