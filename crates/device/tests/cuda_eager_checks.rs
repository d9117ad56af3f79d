//! Eager CUDA index checks (`set_eager_checks(true)`, or `KILN_CUDA_EAGER_CHECKS=1`): the op
//! waits for its own check and returns the CPU's error itself. Its own test binary, because the
//! switch is per process. Skips without a GPU (`cuda_device_or_skip`).
#![cfg(feature = "cuda")]

use kiln_device::cuda::deferred_check_stats;
use kiln_device::prelude::*;
use kiln_device::testing::cuda_device_or_skip;
use kiln_device::{set_eager_checks, CpuStorage, CudaStorage, Error, Layout};

#[test]
fn eager_checks_return_the_error_at_the_op() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    set_eager_checks(true);
    let table = CpuStorage::from_vec((0..40).map(|i| i as f32).collect::<Vec<f32>>());
    let (tl, il) = (Layout::contiguous(&[10, 4]), Layout::contiguous(&[2, 3]));
    let tg = CudaStorage::from_cpu(dev, &table).unwrap();
    let bad = CpuStorage::from_vec(vec![1i64, 2, 3, 4, 5, 11]);
    let cpu_err = table.embedding(&tl, (&bad, &il)).unwrap_err();
    let before = deferred_check_stats(dev);
    let bg = CudaStorage::from_cpu(dev, &bad).unwrap();
    match tg.embedding(&tl, (&bg, &il)) {
        Err(Error::Kernel(e)) => assert_eq!(Some(&e), cpu_err.kernel_error()),
        other => panic!("expected the CPU's error at the op, got {other:?}"),
    }
    let after = deferred_check_stats(dev);
    assert_eq!((after.reads, after.pending), (before.reads + 1, 0));
    // The device keeps working.
    let good = CpuStorage::from_vec(vec![1i64, 2, 3, 4, 5, 9]);
    let out = tg
        .embedding(&tl, (&CudaStorage::from_cpu(dev, &good).unwrap(), &il))
        .unwrap();
    let want = table.embedding(&tl, (&good, &il)).unwrap();
    let got = out.to_cpu(&Layout::contiguous(&[24])).unwrap();
    assert_eq!(got.to_vec::<f32>(), want.to_vec::<f32>());
    set_eager_checks(false);
}
