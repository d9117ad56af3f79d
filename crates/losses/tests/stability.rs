//! Numerical behaviour of the fused cross-entropy: logits of magnitude 1e4 in f32 and up to
//! 1e200 in f64, the mean's denominators with weights and ignored targets, and no gradient work
//! without a graph.

use kiln_autograd::{no_grad, DType, Device, Tensor};
use kiln_losses::*;
use kiln_testkit::{assert_close, Tol};

/// The huge-value checks' tolerance (`atol`, `rtol`): `5e-13 · (1 + |want|)`, within
/// `1e-12 · max(|want|, 1)`.
const TOL: Tol = (5e-13, 5e-13);

#[test]
fn logits_of_magnitude_1e4_give_exact_losses_and_gradients() {
    // Row 0: the target is the largest logit by 1 → loss = log(1 + e^-1).
    // Row 1: the target is 2e4 below the top → loss = 2e4 exactly in f32.
    let x = Tensor::from_slice(
        &[1e4f32, 1e4 - 1.0, -1e4, -1e4, 1e4, -1e4],
        &[2, 3],
        Device::Cpu,
    )
    .unwrap();
    x.set_requires_grad(true).unwrap();
    let t = Tensor::from_slice(&[0i64, 0], &[2], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let loss = cross_entropy(&x, &t, &opts).unwrap();
    let v = loss.to_vec::<f32>().unwrap();
    assert!(
        (v[0] as f64 - (1.0 + (-1.0f64).exp()).ln()).abs() < 1e-6,
        "{v:?}"
    );
    assert_eq!(v[1], 2e4);
    loss.sum_all().unwrap().backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    let p0 = 1.0 / (1.0 + (-1.0f64).exp());
    assert!((g[0] as f64 - (p0 - 1.0)).abs() < 1e-6, "{g:?}");
    assert!((g[1] as f64 - (1.0 - p0)).abs() < 1e-6, "{g:?}");
    assert_eq!(&g[3..], &[-1.0, 1.0, 0.0]);
    assert!(g.iter().all(|v| v.is_finite()));
}

#[test]
fn mean_divides_by_the_weights_of_the_kept_targets() {
    let x = Tensor::zeros(&[3, 2], DType::F64, Device::Cpu).unwrap();
    let w = Tensor::from_slice(&[1.0f64, 3.0], &[2], Device::Cpu).unwrap();
    let t = Tensor::from_slice(&[0i64, 1, -100], &[3], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        weight: Some(&w),
        ..Default::default()
    };
    // Each kept loss is w[y] ln 2; the mean divides by w[0] + w[1] = 4.
    let mean = cross_entropy(&x, &t, &opts).unwrap().item().unwrap();
    assert!((mean - 2f64.ln()).abs() < 1e-15, "{mean}");
    // All targets ignored: 0 / 0 = NaN, as in PyTorch.
    let all_ignored = Tensor::from_slice(&[-100i64; 3], &[3], Device::Cpu).unwrap();
    assert!(cross_entropy(&x, &all_ignored, &opts)
        .unwrap()
        .item()
        .unwrap()
        .is_nan());
}

#[test]
fn no_graph_without_grad() {
    let x = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let t = Tensor::from_slice(&[0i64, 2], &[2], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let with = cross_entropy(&x, &t, &opts).unwrap();
    assert_eq!(with.grad_fn_name(), Some("CrossEntropyBackward"));
    let without = no_grad(|| cross_entropy(&x, &t, &opts)).unwrap();
    assert!(without.grad_fn_name().is_none());
    assert_eq!(
        without.to_vec::<f32>().unwrap(),
        with.to_vec::<f32>().unwrap()
    );
}

#[test]
fn masked_classes_with_minus_infinity_logits_contribute_nothing() {
    // PyTorch: cross_entropy([[-inf, 1, 2]], [1]) = ln(1 + e), gradient [0, p1 - 1, p2].
    let x = Tensor::from_slice(&[f64::NEG_INFINITY, 1.0, 2.0], &[1, 3], Device::Cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let t = Tensor::from_slice(&[1i64], &[1], Device::Cpu).unwrap();
    let loss = cross_entropy(&x, &t, &Default::default()).unwrap();
    let e = std::f64::consts::E;
    assert!((loss.item().unwrap() - (1.0 + e).ln()).abs() < 1e-15);
    loss.backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    let p1 = 1.0 / (1.0 + e);
    assert_eq!(g[0], 0.0);
    assert!(
        (g[1] - (p1 - 1.0)).abs() < 1e-15 && (g[2] - (1.0 - p1)).abs() < 1e-15,
        "{g:?}"
    );
}

#[test]
fn half_precision_logits_run_in_f32_and_round_once() {
    let vals = [0.5f32, -1.25, 2.0, 0.0, 1.5, -0.75];
    let x32 = Tensor::from_slice(&vals, &[2, 3], Device::Cpu).unwrap();
    let t = Tensor::from_slice(&[2i64, 1], &[2], Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        reduction: Reduction::None,
        label_smoothing: 0.1,
        ..Default::default()
    };
    let want = cross_entropy(&x32, &t, &opts)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let x = x32.to_dtype(dtype).unwrap(); // these values are exact in both
        x.set_requires_grad(true).unwrap();
        let loss = cross_entropy(&x, &t, &opts).unwrap();
        assert_eq!(loss.dtype(), dtype);
        let got = loss.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-2 * w.abs(),
                "{dtype}: {got:?} vs {want:?}"
            );
        }
        loss.sum_all().unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().dtype(), dtype);
    }
}

/// Cross-entropy with class weights `[NaN, 1, 0.5]` (class 0 named by no target) over logits
/// `[N, 3, D]` on `device`: every loss and gradient must equal the formula's without class 0's
/// weight, `w_y (lse - z_y)` and `w_y (softmax - onehot(y))`, plain (`D = 1`) and spatial
/// (`D = 2`, the class-major sweep). Before, the NaN reached every position through the
/// smoothing sum's `0 · NaN`. With a probability target whose class-0 share is 0, likewise.
fn weight_of_an_unnamed_class_stays_out_on(device: Device) {
    let w = Tensor::from_slice(&[f64::NAN, 1.0, 0.5], &[3], device).unwrap();
    let z = [0.5, -1.0, 2.0, 1.5, 0.25, -0.5];
    for (shape, labels) in [(&[2usize, 3][..], [2i64, 1]), (&[1, 3, 2][..], [2, 1])] {
        let x = Tensor::from_slice(&z, shape, device).unwrap();
        x.set_requires_grad(true).unwrap();
        let mut tshape = shape.to_vec();
        tshape.remove(1);
        let t = Tensor::from_slice(&labels, &tshape, device).unwrap();
        let options = CrossEntropyOptions {
            weight: Some(&w),
            reduction: Reduction::None,
            ..Default::default()
        };
        let loss = cross_entropy(&x, &t, &options).unwrap();
        loss.sum_all().unwrap().backward().unwrap();
        let (got, grad) = (loss.to_vec::<f64>().unwrap(), x.grad().unwrap());
        let grad = grad.to_vec::<f64>().unwrap();
        // Row r's logits: [N, 3] rows are contiguous; [1, 3, 2] rows are strided by 2.
        let spatial = shape.len() == 3;
        let at = |r: usize, k: usize| if spatial { k * 2 + r } else { r * 3 + k };
        for (r, &y) in labels.iter().enumerate() {
            let row: Vec<f64> = (0..3).map(|k| z[at(r, k)]).collect();
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            let wy = [f64::NAN, 1.0, 0.5][y as usize];
            assert!(
                (got[r] - wy * (lse - row[y as usize])).abs() < 1e-12,
                "{shape:?}: {got:?}"
            );
            for k in 0..3 {
                let want = wy * ((row[k] - lse).exp() - f64::from(k == y as usize));
                assert!((grad[at(r, k)] - want).abs() < 1e-12, "{shape:?}: {grad:?}");
            }
        }
    }
    let x = Tensor::from_slice(&z[..3], &[1, 3], device).unwrap();
    let q = Tensor::from_slice(&[0.0, 0.25, 0.75], &[1, 3], device).unwrap();
    let options = CrossEntropyOptions {
        weight: Some(&w),
        ..Default::default()
    };
    let loss = cross_entropy(&x, &q, &options).unwrap().item().unwrap();
    let lse = z[..3].iter().map(|v| v.exp()).sum::<f64>().ln();
    let want = 0.25 * (lse - z[1]) + 0.75 * 0.5 * (lse - z[2]);
    assert!((loss - want).abs() < 1e-12, "{loss} vs {want}");
}

#[test]
fn the_weight_of_a_class_no_target_names_stays_out_of_the_loss() {
    weight_of_an_unnamed_class_stays_out_on(Device::Cpu);
}

#[test]
fn the_weight_of_a_class_no_target_names_stays_out_of_the_loss_on_cuda() {
    if let Some(cuda) = kiln_device::testing::cuda_device_or_skip() {
        weight_of_an_unnamed_class_stays_out_on(cuda);
    }
}

/// Logits so large that `max + ln(sum)` rounds back to `max` (beyond about 1e16 in f64), and
/// weights so large that any `q·w·z` product overflows, on `device`; the values are PyTorch
/// 2.15's (case 4 by the formula). Before, kiln gave 0 for `ln 2` and a zero gradient (case 2)
/// and NaN for cases 1 and 4.
fn huge_logits_on(device: Device) {
    let none = |weight| CrossEntropyOptions {
        weight,
        reduction: Reduction::None,
        ..Default::default()
    };
    // 1. [1, 2] logits 1e200 with weights 1e200, target 0: loss 1e200·ln 2.
    let x = Tensor::from_slice(&[1e200f64, 1e200], &[1, 2], device).unwrap();
    x.set_requires_grad(true).unwrap();
    let w = Tensor::from_slice(&[1e200f64, 1e200], &[2], device).unwrap();
    let t = Tensor::from_slice(&[0i64], &[1], device).unwrap();
    let loss = cross_entropy(&x, &t, &none(Some(&w))).unwrap();
    loss.sum_all().unwrap().backward().unwrap();
    assert_close(
        "1e200 loss",
        &loss.to_vec::<f64>().unwrap(),
        &[1e200 * 2f64.ln()],
        TOL,
    );
    assert_close(
        "1e200 grad",
        &x.grad().unwrap().to_vec::<f64>().unwrap(),
        &[-5e199, 5e199],
        TOL,
    );
    // 2. [1, 2, 2] logits 1e17 (the class-major sweep), targets [[0, 1]]: ln 2 at each.
    let x = Tensor::from_slice(&[1e17f64; 4], &[1, 2, 2], device).unwrap();
    x.set_requires_grad(true).unwrap();
    let t = Tensor::from_slice(&[0i64, 1], &[1, 2], device).unwrap();
    let loss = cross_entropy(&x, &t, &none(None)).unwrap();
    loss.sum_all().unwrap().backward().unwrap();
    assert_close(
        "1e17 loss",
        &loss.to_vec::<f64>().unwrap(),
        &[2f64.ln(); 2],
        TOL,
    );
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    assert_close("1e17 grad", &g, &[-0.5, 0.5, 0.5, -0.5], TOL);
    // 3. 600 classes 1e17 + 64k, a uniform probability target (many CUDA threads, each with a
    // different running max): loss = mean of (max - z) = 64 · 599 / 2 = 19168 to 1e-27.
    let z: Vec<f64> = (0..600).map(|k| 1e17 + 64.0 * k as f64).collect();
    let x = Tensor::from_slice(&z, &[1, 600], device).unwrap();
    x.set_requires_grad(true).unwrap();
    let q = Tensor::from_slice(&[1.0f64 / 600.0; 600], &[1, 600], device).unwrap();
    let loss = cross_entropy(&x, &q, &none(None)).unwrap();
    loss.sum_all().unwrap().backward().unwrap();
    assert_close(
        "600-class loss",
        &loss.to_vec::<f64>().unwrap(),
        &[19168.0],
        TOL,
    );
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    let (e64, q) = ((-64f64).exp(), 1.0 / 600.0);
    let want = [e64 * e64 - q, e64 - q, 1.0 - e64 - q];
    assert_close("600-class grad", &[g[597], g[598], g[599]], &want, TOL);
    // 4. [1, 2, 2] probability targets, class-major, weights 1e110. Position 0: z = [1e200,
    // 1e200 + 1e190], target [1, 0]: the whole loss is the shifted sum's move as the max rises,
    // w · (z1 - z0) = 1e300, while w · z overflows. Position 1: equal logits, w · ln 2.
    let (w, z1) = (1e110, 1.000_000_000_1e200);
    let x = Tensor::from_slice(&[1e200, 1e200, z1, 1e200], &[1, 2, 2], device).unwrap();
    x.set_requires_grad(true).unwrap();
    let q = Tensor::from_slice(&[1.0f64, 0.25, 0.0, 0.75], &[1, 2, 2], device).unwrap();
    let weight = Tensor::from_slice(&[w, w], &[2], device).unwrap();
    let loss = cross_entropy(&x, &q, &none(Some(&weight))).unwrap();
    loss.sum_all().unwrap().backward().unwrap();
    let want = [w * (z1 - 1e200), w * 2f64.ln()];
    assert_close("shifted loss", &loss.to_vec::<f64>().unwrap(), &want, TOL);
    let g = x.grad().unwrap().to_vec::<f64>().unwrap();
    assert_close("shifted grad", &g, &[-w, 0.25 * w, w, -0.25 * w], TOL);
}

#[test]
fn huge_logits_and_weights_give_pytorchs_losses_and_gradients() {
    huge_logits_on(Device::Cpu);
}

#[test]
fn huge_logits_and_weights_give_pytorchs_losses_and_gradients_on_cuda() {
    if let Some(cuda) = kiln_device::testing::cuda_device_or_skip() {
        huge_logits_on(cuda);
    }
}

/// PyTorch values: an ignored position of `nll_loss` is 0 and adds no weight, whatever class 0
/// holds (it gathers class 0 only as a stand-in); `kl_div`'s `xlogy(t, t)` is NaN for a
/// negative target (not a probability) and 0 for a zero one.
#[test]
fn ignored_positions_and_negative_kl_targets_follow_pytorch() {
    let x = Tensor::from_slice(&[f64::NAN, 0.5, 0.1, 0.2], &[2, 2], Device::Cpu).unwrap();
    let y = Tensor::from_slice(&[-100i64, 1], &[2], Device::Cpu).unwrap();
    let w = Tensor::from_slice(&[f64::NAN, 2.0], &[2], Device::Cpu).unwrap();
    let with = |reduction| NllLossOptions {
        weight: Some(&w),
        reduction,
        ..Default::default()
    };
    let none = nll_loss(&x, &y, &with(Reduction::None)).unwrap();
    assert_eq!(none.to_vec::<f64>().unwrap(), [0.0, -0.4]);
    let mean = nll_loss(&x, &y, &with(Reduction::Mean)).unwrap();
    assert!((mean.item().unwrap() + 0.2).abs() < 1e-15);

    let input = Tensor::from_slice(&[0.5, -1.0, -2.0], &[3], Device::Cpu).unwrap();
    let target = Tensor::from_slice(&[-0.5, 0.0, 0.5], &[3], Device::Cpu).unwrap();
    let kl = kl_div(&input, &target, KlDivReduction::None, false).unwrap();
    let kl = kl.to_vec::<f64>().unwrap();
    assert!(kl[0].is_nan(), "{kl:?}");
    assert_eq!(kl[1], 0.0);
    assert!((kl[2] - 0.5 * (0.5f64.ln() + 2.0)).abs() < 1e-15, "{kl:?}");
}
