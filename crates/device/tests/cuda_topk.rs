//! CUDA top-k (`topk.cu`) against the CPU kernel, bit for bit: every ordered dtype, largest and
//! smallest, k from 0 to the whole row, rows with NaN and ties, a transposed view read with its
//! own stride, rows of one element; and the same errors. Skips without a GPU
//! (`cuda_device_or_skip`).
#![cfg(feature = "cuda")]

use kiln_device::prelude::*;
mod common;

use common::gpu;
use kiln_device::testing::{self, cuda_device_or_skip};
use kiln_device::{CpuStorage, DType, Layout};

fn bits<S: BackendStorage>(s: &S) -> Vec<u64> {
    testing::host_f64(s)
        .unwrap()
        .into_iter()
        .map(f64::to_bits)
        .collect()
}

#[test]
fn cuda_topk_matches_the_cpu_bit_for_bit() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    // 4 rows of 9: repeats (ties) from the pattern's modulus, and a NaN in row 1 for floats.
    let shape = [4, 9];
    let views = [
        ("contiguous", Layout::contiguous(&shape)),
        ("transposed", Layout::contiguous(&[9, 4]).permute(&[1, 0])),
    ];
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
        let mut values: Vec<f64> = (0..36).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
        if dtype != DType::I64 {
            values[11] = f64::NAN;
        }
        let x = testing::cpu_values(values, dtype).unwrap();
        let xg = gpu(dev, &x);
        for (view, layout) in &views {
            for k in [0, 1, 3, 9] {
                for largest in [true, false] {
                    let what = format!("{dtype} {view} k={k} largest={largest}");
                    let (cv, ci) = x.topk_last_dim(layout, k, largest).unwrap();
                    let (gv, gi) = xg.topk_last_dim(layout, k, largest).unwrap();
                    assert_eq!(gv.dtype(), dtype, "{what}");
                    assert_eq!(gi.dtype(), DType::I64, "{what}");
                    assert_eq!(bits(&gv), bits(&cv), "{what}: values");
                    assert_eq!(bits(&gi), bits(&ci), "{what}: indices");
                }
            }
        }
    }
    // Reference values on the device: torch.topk([0.3, -1.2, 2.5, 0.9, -0.4], 2) is
    // values [2.5, 0.9], indices [2, 3].
    let row = gpu(
        dev,
        &CpuStorage::from_vec(vec![0.3f32, -1.2, 2.5, 0.9, -0.4]),
    );
    let (v, i) = row
        .topk_last_dim(&Layout::contiguous(&[5]), 2, true)
        .unwrap();
    assert_eq!(testing::host_f64(&v).unwrap(), vec![2.5, 0.9f32 as f64]);
    assert_eq!(testing::host_f64(&i).unwrap(), vec![2.0, 3.0]);
    // A 0-d view: one row of one element.
    let (v, i) = row
        .topk_last_dim(&Layout::new(vec![], vec![], 2), 1, false)
        .unwrap();
    assert_eq!(
        (
            testing::host_f64(&v).unwrap(),
            testing::host_f64(&i).unwrap()
        ),
        (vec![2.5], vec![0.0])
    );
    // The errors are the CPU's.
    let layout = Layout::contiguous(&[5]);
    let cpu_err = CpuStorage::from_vec(vec![0.0f32; 5])
        .topk_last_dim(&layout, 6, true)
        .unwrap_err()
        .to_string();
    let gpu_err = row.topk_last_dim(&layout, 6, true).unwrap_err().to_string();
    assert_eq!(gpu_err, cpu_err);
}
