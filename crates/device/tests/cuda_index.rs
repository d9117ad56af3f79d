//! CUDA indexing parity: embedding, index_select, gather, scatter/scatter_add and their
//! backward on `CudaStorage` against the CPU backend, including the index-error reports
//! (same variant, value and coordinates; reported at the op or, deferred, at the next copy to
//! the host). Skips without a GPU (`cuda_device_or_skip`).
#![cfg(feature = "cuda")]

use kiln_device::prelude::*;
mod common;

use kiln_device::testing::cuda_device_or_skip;
use kiln_device::{CpuStorage, CudaStorage, DType, Error, Layout};

use common::{assert_match, gpu};

fn values(n: usize, dtype: DType) -> CpuStorage {
    common::pattern(n, dtype, 1, 0.5, -6.0)
}

/// The CPU's eager error and the CUDA op's: at the op in eager mode, else (deferred) at the
/// next copy to the host, naming the op; same variant, value and coordinates either way.
fn same_error<T: std::fmt::Debug>(
    what: &str,
    want: Result<T, Error>,
    got: Result<CudaStorage, Error>,
) {
    let want = match want {
        Err(Error::Kernel(w)) => w,
        other => panic!("{what}: the cpu gave {other:?}"),
    };
    let got = match got {
        Err(Error::Kernel(g)) => g,
        Ok(out) => match out.to_cpu(&Layout::contiguous(&[out.len()])) {
            Err(Error::DeferredCheck { op, error, .. }) => {
                assert!(what.starts_with(op), "{what}: reported for op {op}");
                *error
            }
            other => panic!("{what}: expected a deferred check error, got {other:?}"),
        },
        Err(other) => panic!("{what}: cuda gave {other:?}"),
    };
    assert_eq!(got, want, "{what}");
}

#[test]
fn embedding_and_backward_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let idx = CpuStorage::from_vec(vec![3i64, 0, 3, 9, 1, 3]);
    let il = Layout::contiguous(&[2, 3]);
    let (ig, tl) = (gpu(dev, &idx), Layout::contiguous(&[10, 4]));
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
        let table = values(40, dtype);
        let tg = gpu(dev, &table);
        assert_match(
            &format!("embedding {dtype}"),
            &table.embedding(&tl, (&idx, &il)).unwrap(),
            &tg.embedding(&tl, (&ig, &il)).unwrap(),
        );
    }
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let grad = values(24, dtype);
        let gl = Layout::contiguous(&[2, 3, 4]);
        let gg = gpu(dev, &grad);
        for padding in [None, Some(3)] {
            assert_match(
                &format!("embedding_backward {dtype} {padding:?}"),
                &grad
                    .embedding_backward(&gl, (&idx, &il), 10, padding)
                    .unwrap(),
                &gg.embedding_backward(&gl, (&ig, &il), 10, padding).unwrap(),
            );
        }
    }
    let bad = CpuStorage::from_vec(vec![1i64, 2, 10, -1, 0, 0]);
    let table = values(40, DType::F32);
    same_error(
        "embedding bad index",
        table.embedding(&tl, (&bad, &il)),
        gpu(dev, &table).embedding(&tl, (&gpu(dev, &bad), &il)),
    );
}

#[test]
fn index_select_and_backward_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let idx = CpuStorage::from_vec(vec![2i64, 0, 2, 1]);
    let (ig, il) = (gpu(dev, &idx), Layout::contiguous(&[4]));
    // [3, 4, 5] viewed transposed to [5, 4, 3]
    let l = Layout::contiguous(&[3, 4, 5]).permute(&[2, 1, 0]);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::Bool] {
        let x = values(60, dtype);
        let xg = gpu(dev, &x);
        for dim in 0..3 {
            if l.shape()[dim] < 3 {
                continue;
            }
            assert_match(
                &format!("index_select {dtype} dim {dim}"),
                &x.index_select(&l, dim, (&idx, &il)).unwrap(),
                &xg.index_select(&l, dim, (&ig, &il)).unwrap(),
            );
        }
    }
    let input_shape = [3, 5, 2];
    let grad = values(3 * 4 * 2, DType::F32);
    let gl = Layout::contiguous(&[3, 4, 2]);
    assert_match(
        "index_select_backward",
        &grad
            .index_select_backward(&gl, &input_shape, 1, (&idx, &il))
            .unwrap(),
        &gpu(dev, &grad)
            .index_select_backward(&gl, &input_shape, 1, (&ig, &il))
            .unwrap(),
    );
    let bad = CpuStorage::from_vec(vec![0i64, 7, 1, 1]);
    let x = values(60, DType::F32);
    same_error(
        "index_select bad index",
        x.index_select(&l, 1, (&bad, &il)),
        gpu(dev, &x).index_select(&l, 1, (&gpu(dev, &bad), &il)),
    );
}

#[test]
fn gather_scatter_and_scatter_add_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    // index [2, 3] into a [3, 4] input along dim 1 and dim 0; no repeated targets for scatter
    let idx = CpuStorage::from_vec(vec![3i64, 0, 1, 2, 1, 0]);
    let (ig, il) = (gpu(dev, &idx), Layout::contiguous(&[2, 3]));
    let xl = Layout::contiguous(&[4, 3]).transpose(0, 1);
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64] {
        let x = values(12, dtype);
        let xg = gpu(dev, &x);
        assert_match(
            &format!("gather {dtype}"),
            &x.gather(&xl, 1, (&idx, &il)).unwrap(),
            &xg.gather(&xl, 1, (&ig, &il)).unwrap(),
        );
        let src = values(9, dtype);
        let sl = Layout::contiguous(&[3, 3]);
        let sg = gpu(dev, &src);
        assert_match(
            &format!("scatter {dtype}"),
            &x.scatter(&xl, 1, (&idx, &il), (&src, &sl), false).unwrap(),
            &xg.scatter(&xl, 1, (&ig, &il), (&sg, &sl), false).unwrap(),
        );
        if dtype.is_float() {
            // dim 0: index values repeat within columns, so additions collide
            let idx0 = CpuStorage::from_vec(vec![2i64, 2, 0, 2, 1, 2]);
            let ig0 = gpu(dev, &idx0);
            assert_match(
                &format!("scatter_add {dtype}"),
                &x.scatter(&xl, 0, (&idx0, &il), (&src, &sl), true).unwrap(),
                &xg.scatter(&xl, 0, (&ig0, &il), (&sg, &sl), true).unwrap(),
            );
        }
    }
    let x = values(12, DType::F32);
    let bad = CpuStorage::from_vec(vec![0i64, 1, 2, 3, 4, 0]);
    same_error(
        "gather bad index",
        x.gather(&xl, 1, (&bad, &il)),
        gpu(dev, &x).gather(&xl, 1, (&gpu(dev, &bad), &il)),
    );
}
