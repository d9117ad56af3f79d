//! `KILN_EMU_SCHEDULE=reverse` runs a block's threads last to first between barriers, so a
//! missing `__syncthreads` that the in-order schedule hides shows up (in its own test binary:
//! the schedule is read from the environment).

mod common;
mod runtime_support;

use runtime_support::{launch, load, Arg};

#[test]
fn reverse_schedule_exposes_a_missing_syncthreads() {
    let _g = common::setup(&[("KILN_EMU_SCHEDULE", "reverse")]);
    common::bind(0);
    let m = load(
        "neighbour.cu",
        r#"extern "C" __global__ void racy(int* out) {
            __shared__ int sh[64];
            unsigned t = threadIdx.x;
            sh[t] = (int)t;
            out[t] = t ? sh[t - 1] : 0;   // no __syncthreads: reads a neighbour's write
        }
        extern "C" __global__ void synced(int* out) {
            __shared__ int sh[64];
            unsigned t = threadIdx.x;
            sh[t] = (int)t;
            __syncthreads();
            out[t] = t ? sh[t - 1] : 0;
        }"#,
    );
    let out = common::alloc(64 * 4).unwrap();
    let read = || {
        let mut v = vec![0i32; 64];
        let r =
            unsafe { kiln_cuda_emu::driver::cuMemcpyDtoH_v2(v.as_mut_ptr() as *mut _, out, 256) };
        assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
        v
    };
    let want: Vec<i32> = (0..64).map(|t| (t - 1).max(0)).collect();
    launch(&m, "synced", [1, 1, 1], [64, 1, 1], &[Arg::U64(out)]).unwrap();
    assert_eq!(read(), want);
    launch(&m, "racy", [1, 1, 1], [64, 1, 1], &[Arg::U64(out)]).unwrap();
    let got = read();
    assert!(
        got[1..].iter().all(|&v| v == -1),
        "the race should read poison: {got:?}"
    );
}
