//! Tests of the family's dispatch on host storages: norms, scale and copy of the total, typed
//! errors for strided views, wrong dtypes and short buffers, and an Adam step.

use super::super::{clip_coef, AdamStepScalars};
use super::*;

fn f32s(v: &[f32]) -> (Storage, Layout) {
    (
        Storage::from_vec(v.to_vec()),
        Layout::contiguous(&[v.len()]),
    )
}

fn values(st: &Storage) -> Vec<f32> {
    match st {
        Storage::Cpu(c) => c.to_vec::<f32>().unwrap(),
        #[cfg(feature = "cuda")]
        Storage::Cuda(_) => unreachable!("the tests build host storages"),
    }
}

#[test]
fn host_lists_get_the_norm_the_coefficient_and_the_scale() {
    let (a, la) = f32s(&[3.0, 0.0]);
    let (mut b, lb) = f32s(&[0.0, 4.0]);
    let norm = global_norm("t", &[(&a, &la), (&b, &lb)], NormKind::Two, 1.0).unwrap();
    assert_eq!(norm.total().unwrap(), 5.0);
    assert_eq!(norm.host_coef(), Some(clip_coef(1.0, 5.0)));
    assert_eq!(norm.per_tensor(), Some(&[3.0, 4.0][..]));
    scale_by_clip_coef_("t", &mut [(&mut b, &lb)], &norm).unwrap();
    assert_eq!(values(&b), vec![0.0, 4.0 * clip_coef(1.0, 5.0) as f32]);
    let (mut out, lo) = (Storage::from_vec(vec![0f32]), Layout::contiguous(&[]));
    norm.copy_total_into("t", (&mut out, &lo)).unwrap();
    assert_eq!(values(&out), vec![5.0]);
    let empty = global_norm("t", &[], NormKind::Two, 1.0).unwrap();
    assert_eq!(empty.total().unwrap(), 0.0);
}

/// The fused clip gives the bits of the norm op followed by the scale op, skips the scale for a
/// coefficient of 1 or more, and with `refuse_nonfinite` leaves a list of non-finite total
/// alone (without it, an infinite total scales by zero, as PyTorch does).
#[test]
fn the_fused_clip_equals_the_norm_then_the_scale() {
    let data: [&[f32]; 3] = [&[3.0, -0.5, 1.25], &[0.0, 4.0], &[-2.0; 70]];
    let clip = |max_norm: f64, refuse: bool, data: &[&[f32]]| {
        let mut lists: Vec<(Storage, Layout)> = data.iter().map(|v| f32s(v)).collect();
        let mut ops: Vec<OperandMut<'_>> = lists.iter_mut().map(|(s, l)| (s, &*l)).collect();
        let (norm, refused) =
            clip_by_global_norm_("t", &mut ops, NormKind::Two, max_norm, refuse).unwrap();
        let total = norm.total().unwrap();
        let out: Vec<Vec<f32>> = lists.iter().map(|(s, _)| values(s)).collect();
        (total, refused, out)
    };
    for max_norm in [0.5, 1e9] {
        let mut lists: Vec<(Storage, Layout)> = data.iter().map(|v| f32s(v)).collect();
        let read: Vec<Operand<'_>> = lists.iter().map(|(s, l)| (s, l)).collect();
        let norm = global_norm("t", &read, NormKind::Two, max_norm).unwrap();
        let mut ops: Vec<OperandMut<'_>> = lists.iter_mut().map(|(s, l)| (s, &*l)).collect();
        scale_by_clip_coef_("t", &mut ops, &norm).unwrap();
        let want: Vec<Vec<f32>> = lists.iter().map(|(s, _)| values(s)).collect();
        let (total, refused, got) = clip(max_norm, false, &data);
        assert_eq!((total, refused), (norm.total().unwrap(), false));
        assert_eq!(got, want, "max_norm {max_norm}");
    }
    let unscaled: Vec<Vec<f32>> = data.iter().map(|v| v.to_vec()).collect();
    assert_eq!(clip(1e9, false, &data).2, unscaled);
    let inf: [&[f32]; 2] = [&[1.0, f32::INFINITY], &[2.0]];
    let (total, refused, out) = clip(1.0, true, &inf);
    assert_eq!((total, refused), (f64::INFINITY, true));
    assert_eq!(out, vec![vec![1.0, f32::INFINITY], vec![2.0]]);
    let (_, refused, out) = clip(1.0, false, &inf);
    assert!(!refused);
    assert_eq!(out[1], vec![0.0]);
}

#[test]
fn strided_operands_and_wrong_dtypes_are_typed_errors() {
    let (a, _) = f32s(&[1.0, 2.0, 3.0, 4.0]);
    let strided = Layout::new(vec![2], vec![2], 0);
    let err = global_norm("clip_grad_norm_", &[(&a, &strided)], NormKind::Two, 1.0);
    assert!(matches!(
        err,
        Err(Error::Kernel(KernelError::InvalidShape {
            op: "clip_grad_norm_",
            ..
        }))
    ));
    let ints = Storage::from_vec(vec![1i64, 2]);
    let err = per_tensor_norms(
        "get_total_norm",
        &[(&ints, &Layout::contiguous(&[2]))],
        NormKind::Two,
    );
    assert!(matches!(
        err,
        Err(Error::UnsupportedDType {
            op: "get_total_norm",
            ..
        })
    ));
    let past_end = Layout::new(vec![4], vec![1], 2);
    let err = per_tensor_norms("get_total_norm", &[(&a, &past_end)], NormKind::Two);
    assert!(matches!(
        err,
        Err(Error::Kernel(KernelError::BufferLength { .. }))
    ));
}

fn adam_on(p: &mut Storage, g: &Storage, m: &mut Storage, v: &mut Storage) -> Result<()> {
    let l = Layout::contiguous(&[2]);
    let mut list = [AdamOperands {
        param: (p, &l),
        grad: (g, &l),
        exp_avg: (m, &l),
        exp_avg_sq: (v, &l),
        max_exp_avg_sq: None,
        scalars: AdamStepScalars {
            step_size: 0.1 / (1.0 - 0.9),
            bias_correction2_sqrt: (1.0f64 - 0.999).sqrt(),
        },
    }];
    let hyper = AdamHyper {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: true,
        maximize: false,
        grad_scale: 1.0,
    };
    adam_step("AdamW", &mut list, &hyper)
}

#[test]
fn adam_steps_host_params_and_refuses_mismatched_state() {
    let (mut p, _) = f32s(&[1.0, -1.0]);
    let (g, _) = f32s(&[0.5, -2.0]);
    let (mut m, _) = f32s(&[0.0, 0.0]);
    let (mut v, _) = f32s(&[0.0, 0.0]);
    adam_on(&mut p, &g, &mut m, &mut v).unwrap();
    // The first step moves each parameter by lr * sign(g) (up to eps).
    let got = values(&p);
    assert!(
        (got[0] - 0.9).abs() < 1e-6 && (got[1] + 0.9).abs() < 1e-6,
        "{got:?}"
    );
    let mut wrong = Storage::from_vec(vec![0f64; 2]);
    let err = adam_on(&mut p, &g, &mut wrong, &mut v);
    assert!(matches!(err, Err(Error::DTypeMismatch { op: "AdamW", .. })));
    let mut short = Storage::from_vec(vec![0f32; 1]);
    let err = adam_on(&mut p, &g, &mut m, &mut short);
    assert!(matches!(
        err,
        Err(Error::Kernel(KernelError::BufferLength { .. }))
    ));
}
