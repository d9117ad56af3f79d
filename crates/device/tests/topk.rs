//! CPU top-k against reference values: PyTorch's `torch.topk` results for distinct values
//! (written out below), NaN ranked above every number, ties by position, strided views, every
//! dtype with an order, and the errors for `k` past the row and for bool.

use kiln_device::prelude::*;
use kiln_device::{testing, CpuStorage, DType, Error, Layout};

fn top(x: &CpuStorage, layout: &Layout, k: usize, largest: bool) -> (Vec<f64>, Vec<f64>) {
    let (v, i) = x.topk_last_dim(layout, k, largest).unwrap();
    assert_eq!(i.dtype(), DType::I64);
    assert_eq!(v.dtype(), x.dtype());
    (
        testing::host_f64(&v).unwrap(),
        testing::host_f64(&i).unwrap(),
    )
}

#[test]
fn matches_torch_topk_on_distinct_values() {
    // torch.topk(torch.tensor([[0.3, -1.2, 2.5, 0.9, -0.4], [4.0, 3.5, -2.0, 0.0, 1.25]]), 3):
    // values [[2.5, 0.9, 0.3], [4.0, 3.5, 1.25]], indices [[2, 3, 0], [0, 1, 4]];
    // largest=False: values [[-1.2, -0.4, 0.3], [-2.0, 0.0, 1.25]], indices [[1, 4, 0], [2, 3, 4]].
    let data = vec![0.3, -1.2, 2.5, 0.9, -0.4, 4.0, 3.5, -2.0, 0.0, 1.25];
    let l = Layout::contiguous(&[2, 5]);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let x = testing::cpu_values(data.clone(), dtype).unwrap();
        let round = |v: &[f64]| {
            testing::host_f64(&testing::cpu_values(v.to_vec(), dtype).unwrap()).unwrap()
        };
        let (v, i) = top(&x, &l, 3, true);
        assert_eq!(v, round(&[2.5, 0.9, 0.3, 4.0, 3.5, 1.25]), "{dtype}");
        assert_eq!(i, [2.0, 3.0, 0.0, 0.0, 1.0, 4.0], "{dtype}");
        let (v, i) = top(&x, &l, 3, false);
        assert_eq!(v, round(&[-1.2, -0.4, 0.3, -2.0, 0.0, 1.25]), "{dtype}");
        assert_eq!(i, [1.0, 4.0, 0.0, 2.0, 3.0, 4.0], "{dtype}");
    }
    let ints = CpuStorage::from_vec(vec![5i64, -3, 9, 9, 0, i64::MAX, i64::MAX - 1]);
    let (v, i) = top(&ints, &Layout::contiguous(&[7]), 4, true);
    assert_eq!(i, [5.0, 6.0, 2.0, 3.0]);
    assert_eq!(v[2..], [9.0, 9.0]);
    let (got, _) = ints
        .topk_last_dim(&Layout::contiguous(&[7]), 2, true)
        .unwrap();
    assert_eq!(got.to_vec::<i64>().unwrap(), vec![i64::MAX, i64::MAX - 1]);
}

#[test]
fn nan_ranks_first_ties_rank_by_position_and_views_need_no_copy() {
    let x = CpuStorage::from_vec(vec![1.0f32, f32::NAN, 3.0, 3.0, 7.0, 3.0]);
    let (v, i) = top(&x, &Layout::contiguous(&[6]), 6, true);
    assert!(v[0].is_nan());
    assert_eq!(
        (&v[1..], i),
        (
            &[7.0, 3.0, 3.0, 3.0, 1.0][..],
            vec![1.0, 4.0, 2.0, 3.0, 5.0, 0.0]
        )
    );
    let (v, i) = top(&x, &Layout::contiguous(&[6]), 6, false);
    assert!(v[5].is_nan());
    assert_eq!(
        (&v[..5], i),
        (
            &[1.0, 3.0, 3.0, 3.0, 7.0][..],
            vec![0.0, 2.0, 3.0, 5.0, 4.0, 1.0]
        )
    );

    // The transpose of a [2, 3] matrix: rows are its columns, read with stride 3.
    let m = CpuStorage::from_vec(vec![1.0f64, 6.0, 2.0, 5.0, 3.0, 4.0]);
    let t = Layout::contiguous(&[2, 3]).permute(&[1, 0]);
    let (v, i) = top(&m, &t, 1, true);
    assert_eq!((v, i), (vec![5.0, 6.0, 4.0], vec![1.0, 0.0, 1.0]));
}

#[test]
fn k_zero_and_a_zero_d_view_and_the_errors() {
    let x = CpuStorage::from_vec(vec![2.0f32, 1.0, 0.0, 4.0]);
    let (v, i) = top(&x, &Layout::contiguous(&[2, 2]), 0, true);
    assert!(v.is_empty() && i.is_empty());
    // A 0-d view is one row of one element.
    let (v, i) = top(&x, &Layout::new(vec![], vec![], 3), 1, true);
    assert_eq!((v, i), (vec![4.0], vec![0.0]));
    let err = x
        .topk_last_dim(&Layout::contiguous(&[2, 2]), 3, true)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("k = 3 is larger than the 2 elements of the last dim"),
        "{msg}"
    );
    let bools = testing::cpu_values(vec![1.0, 0.0], DType::Bool).unwrap();
    let err = bools
        .topk_last_dim(&Layout::contiguous(&[2]), 1, true)
        .unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedDType { op: "topk", .. }),
        "{err}"
    );
}
