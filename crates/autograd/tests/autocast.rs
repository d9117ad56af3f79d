//! `autocast` on the CPU (and on CUDA when a GPU is usable): output dtypes follow PyTorch's op
//! lists (matmul/conv2d in the 16-bit dtype, softmax/layer_norm/sum/mean/logsumexp/norm in f32,
//! batch_norm in its input's dtype with f32 statistics, F64 never cast), values stay within bf16 rounding of the f32 computation, gradients reach
//! f32 leaves in f32, and scopes nest and end.

mod common;

use common::devices;
use kiln_autograd::{autocast, autocast_dtype, AutocastGuard, DType, Device, Generator, Tensor};

fn randn(seed: u64, shape: &[usize], dev: Device) -> Tensor {
    Generator::new(seed)
        .normal(shape, 0.0, 1.0, DType::F32, dev)
        .unwrap()
}

/// `got` within bf16 rounding of `want`: a few units of bf16's 2^-8 relative step, scaled by
/// the largest magnitude (sums of rounded products).
fn assert_bf16_close(what: &str, got: &Tensor, want: &Tensor) {
    let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
    assert_eq!(g.len(), w.len(), "{what}");
    let scale = w.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= 3e-2 * scale,
            "{what}[{i}]: {a} vs {b} (scale {scale})"
        );
    }
}

#[test]
fn matmul_and_conv_run_in_bf16_and_reductions_in_f32() {
    for dev in devices() {
        let (a, b) = (randn(1, &[8, 16], dev), randn(2, &[16, 4], dev));
        let want = a.matmul(&b).unwrap();
        let x = randn(3, &[2, 3, 6, 6], dev);
        let w = randn(4, &[4, 3, 3, 3], dev);
        let conv_want = x.conv2d(&w, None, Default::default()).unwrap();
        let (got, conv, soft, total, mean, ln, lse, nrm) = autocast(DType::BF16, || {
            assert_eq!(autocast_dtype(), Some(DType::BF16));
            let got = a.matmul(&b).unwrap();
            let conv = x.conv2d(&w, None, Default::default()).unwrap();
            // 16-bit activations into f32-list ops
            let soft = got.softmax(-1).unwrap();
            let total = got.sum_all().unwrap();
            let mean = got.mean(&[0], false).unwrap();
            let ln = got.layer_norm(&[4], None, None, 1e-5).unwrap();
            let lse = got.logsumexp(&[1], false).unwrap();
            let nrm = got.norm(2.0, &[1], false).unwrap();
            (got, conv, soft, total, mean, ln, lse, nrm)
        })
        .unwrap();
        assert_eq!(autocast_dtype(), None, "the scope ended");
        assert_eq!((got.dtype(), conv.dtype()), (DType::BF16, DType::BF16));
        for (name, t) in [("softmax", &soft), ("sum", &total), ("mean", &mean)] {
            assert_eq!(t.dtype(), DType::F32, "{name} runs in f32 under autocast");
        }
        for (name, t) in [("layer_norm", &ln), ("logsumexp", &lse), ("norm", &nrm)] {
            assert_eq!(t.dtype(), DType::F32, "{name} runs in f32 under autocast");
        }
        assert_bf16_close("matmul", &got, &want);
        assert_bf16_close("conv2d", &conv, &conv_want);
        assert_bf16_close("softmax", &soft, &want.softmax(-1).unwrap());
        assert_bf16_close("sum", &total, &want.sum_all().unwrap());
        // Outside the scope the same ops keep their input dtype.
        assert_eq!(a.matmul(&b).unwrap().dtype(), DType::F32);
        assert_eq!(got.sum_all().unwrap().dtype(), DType::BF16);
    }
}

#[test]
fn gradients_reach_f32_leaves_in_f32() {
    for dev in devices() {
        let (a, b) = (randn(5, &[6, 5], dev), randn(6, &[5, 3], dev));
        let (ra, rb) = (a.detach(), b.detach());
        for t in [&a, &b, &ra, &rb] {
            t.set_requires_grad(true).unwrap();
        }
        let loss = {
            let _scope = AutocastGuard::new(DType::BF16).unwrap();
            a.matmul(&b).unwrap().sum_all().unwrap()
        };
        loss.backward().unwrap();
        ra.matmul(&rb)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let (ga, gra) = (a.grad().unwrap(), ra.grad().unwrap());
        assert_eq!(ga.dtype(), DType::F32);
        assert_bf16_close("grad a", &ga, &gra);
        assert_bf16_close("grad b", &b.grad().unwrap(), &rb.grad().unwrap());
    }
}

/// `x @ w` as a custom op whose backward calls `matmul` (as user-written backward code does).
fn custom_product(x: &Tensor, w: &Tensor) -> Tensor {
    let y = kiln_autograd::no_grad(|| x.matmul(w)).unwrap();
    Tensor::record_op("CustomProductBackward", &[x], &y, |_| {
        let w_t = w.save_for_backward().t().unwrap();
        Box::new(move |g| Ok(vec![Some(g.matmul(&w_t)?)]))
    })
}

/// Backward called inside an autocast scope runs in the dtypes the forward recorded (PyTorch's
/// rule), user-written backward code included: a graph built in f32 outside the scope gets
/// exactly the gradients it gets outside.
#[test]
fn backward_inside_an_autocast_scope_runs_in_the_forwards_dtypes() {
    for dev in devices() {
        let (x, w) = (randn(7, &[6, 5], dev), randn(8, &[5, 3], dev));
        let rx = x.detach();
        for t in [&x, &rx] {
            t.set_requires_grad(true).unwrap();
        }
        let loss = custom_product(&x, &w).tanh().unwrap().sum_all().unwrap();
        autocast(DType::BF16, || loss.backward()).unwrap().unwrap();
        let reference = custom_product(&rx, &w).tanh().unwrap().sum_all().unwrap();
        reference.backward().unwrap();
        let (got, want) = (x.grad().unwrap(), rx.grad().unwrap());
        assert_eq!(got.dtype(), DType::F32);
        let (g, w) = (got.to_vec_f64().unwrap(), want.to_vec_f64().unwrap());
        assert_eq!(g, w, "the scope changed backward's arithmetic");
    }
}

#[test]
fn f64_is_never_cast_scopes_nest_and_bad_dtypes_are_refused() {
    let a = Generator::new(1)
        .normal(&[3, 3], 0.0, 1.0, DType::F64, Device::Cpu)
        .unwrap();
    autocast(DType::F16, || {
        assert_eq!(a.matmul(&a).unwrap().dtype(), DType::F64);
        {
            let _off = AutocastGuard::disabled();
            assert_eq!(autocast_dtype(), None);
            let _inner = AutocastGuard::new(DType::BF16).unwrap();
            assert_eq!(autocast_dtype(), Some(DType::BF16));
        }
        assert_eq!(autocast_dtype(), Some(DType::F16));
    })
    .unwrap();
    let e = AutocastGuard::new(DType::F32).err().unwrap().to_string();
    assert!(e.contains("BF16"), "{e}");
}

#[test]
fn mixed_float_binary_ops_promote_to_f32_and_batch_norm_keeps_bf16() {
    use kiln_autograd::BatchNormOptions;
    for dev in devices() {
        let (x, w) = (randn(7, &[4, 6], dev), randn(8, &[6, 3], dev));
        let bias = randn(9, &[3], dev);
        let want = x.matmul(&w).unwrap().add(&bias).unwrap();
        let img = randn(10, &[2, 3, 4, 4], dev);
        let k = randn(11, &[3, 3, 1, 1], dev);
        let bn_want = {
            let y = img.conv2d(&k, None, Default::default()).unwrap();
            let (m, v) = (
                Tensor::zeros(&[3], DType::F32, dev).unwrap(),
                Tensor::ones(&[3], DType::F32, dev).unwrap(),
            );
            let out = y
                .batch_norm(Some(&m), Some(&v), None, None, BatchNormOptions::default())
                .unwrap();
            (out, m, v)
        };
        let (m, v) = (
            Tensor::zeros(&[3], DType::F32, dev).unwrap(),
            Tensor::ones(&[3], DType::F32, dev).unwrap(),
        );
        let (got, bn) = autocast(DType::BF16, || {
            let got = x.matmul(&w).unwrap().add(&bias).unwrap();
            let y = img.conv2d(&k, None, Default::default()).unwrap();
            assert_eq!(y.dtype(), DType::BF16);
            let bn = y
                .batch_norm(Some(&m), Some(&v), None, None, BatchNormOptions::default())
                .unwrap();
            (got, bn)
        })
        .unwrap();
        assert_eq!(got.dtype(), DType::F32, "bf16 matmul + f32 bias promotes");
        assert_eq!(
            bn.dtype(),
            DType::BF16,
            "batch_norm keeps the 16-bit input dtype (f32 statistics inside)"
        );
        assert_bf16_close("linear", &got, &want);
        assert_bf16_close("batch_norm", &bn, &bn_want.0);
        // The running statistics were updated in place, in f32, like the f32 run's.
        assert_eq!((m.dtype(), v.dtype()), (DType::F32, DType::F32));
        assert_bf16_close("running_mean", &m, &bn_want.1);
        assert_bf16_close("running_var", &v, &bn_want.2);
        assert_ne!(m.to_vec_f64().unwrap(), vec![0.0; 3]);
        // Outside autocast, mixed dtypes are still refused with the fix.
        let err = got
            .to_dtype(DType::BF16)
            .unwrap()
            .add(&bias)
            .unwrap_err()
            .to_string();
        assert!(err.contains("to_dtype"), "{err}");
    }
}

#[test]
fn conv_batch_norm_relu_stays_bf16_and_gradients_reach_f32_parameters() {
    use kiln_autograd::BatchNormOptions;
    for dev in devices() {
        let x = randn(12, &[2, 3, 6, 6], dev);
        let k = randn(13, &[4, 3, 3, 3], dev);
        let (gamma, beta) = (
            randn(14, &[4], dev).add_scalar(1.0).unwrap(),
            randn(15, &[4], dev),
        );
        // Positions where the f32 activation lies within bf16 rounding of relu's kink get no
        // upstream gradient, so a relu mask flipped by rounding cannot move the gradients
        // compared below.
        let kink = {
            let (m, v) = (
                Tensor::zeros(&[4], DType::F32, dev).unwrap(),
                Tensor::ones(&[4], DType::F32, dev).unwrap(),
            );
            let y = x.conv2d(&k, None, Default::default()).unwrap();
            let bn = y
                .batch_norm(
                    Some(&m),
                    Some(&v),
                    Some(&gamma),
                    Some(&beta),
                    Default::default(),
                )
                .unwrap();
            bn.abs().unwrap().gt_scalar(0.05).unwrap()
        };
        let upstream = randn(16, &[2, 4, 4, 4], dev)
            .mul(&kink.to_dtype(DType::F32).unwrap())
            .unwrap();
        // The same chain in f32 (reference) and under bf16 autocast, on separate leaves and
        // running statistics.
        let chain = |autocast_on: bool| {
            let leaves = [k.detach(), gamma.detach(), beta.detach()];
            for t in &leaves {
                t.set_requires_grad(true).unwrap();
            }
            let (m, v) = (
                Tensor::zeros(&[4], DType::F32, dev).unwrap(),
                Tensor::ones(&[4], DType::F32, dev).unwrap(),
            );
            let scope = autocast_on.then(|| AutocastGuard::new(DType::BF16).unwrap());
            let y = x.conv2d(&leaves[0], None, Default::default()).unwrap();
            let bn = y
                .batch_norm(
                    Some(&m),
                    Some(&v),
                    Some(&leaves[1]),
                    Some(&leaves[2]),
                    BatchNormOptions::default(),
                )
                .unwrap();
            let act = bn.relu().unwrap();
            let loss = act
                .to_dtype(DType::F32)
                .unwrap()
                .mul(&upstream)
                .unwrap()
                .sum_all()
                .unwrap();
            drop(scope);
            loss.backward().unwrap();
            (y.dtype(), bn.dtype(), act, leaves, m, v)
        };
        let (_, _, act_want, want, m_want, v_want) = chain(false);
        let (conv_dt, bn_dt, act, got, m, v) = chain(true);
        assert_eq!(conv_dt, DType::BF16, "conv2d runs in bf16");
        assert_eq!(
            bn_dt,
            DType::BF16,
            "batch_norm keeps bf16 (no f32 round trip)"
        );
        assert_eq!(
            act.dtype(),
            DType::BF16,
            "relu of a bf16 activation is bf16"
        );
        assert_bf16_close("activation", &act, &act_want);
        for (name, g, w) in [
            ("conv weight", &got[0], &want[0]),
            ("bn weight", &got[1], &want[1]),
            ("bn bias", &got[2], &want[2]),
        ] {
            let (gg, gw) = (g.grad().unwrap(), w.grad().unwrap());
            assert_eq!(
                gg.dtype(),
                DType::F32,
                "{name}: the f32 parameter's gradient is f32"
            );
            assert_bf16_close(&format!("grad {name}"), &gg, &gw);
        }
        assert_eq!((m.dtype(), v.dtype()), (DType::F32, DType::F32));
        assert_bf16_close("running_mean", &m, &m_want);
        assert_bf16_close("running_var", &v, &v_want);
        assert_eq!((m.version(), v.version()), (1, 1), "updated in place once");
    }
}
