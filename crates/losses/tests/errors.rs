//! One test per error class, asserting the message names the problem and the fix.

use kiln_autograd::{DType, Device, Tensor};
use kiln_losses::*;

fn logits(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f32 * 0.1).collect(), shape, Device::Cpu).unwrap()
}

fn ints(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

fn err(r: Result<Tensor>) -> (Error, String) {
    let e = r.expect_err("expected an error");
    let msg = e.to_string();
    (e, msg)
}

#[test]
fn integer_one_hot_targets_for_cross_entropy_explain_indices_and_argmax() {
    let one_hot = ints(&[1, 0, 0, 0, 0, 1], &[2, 3]);
    let (e, msg) = err(cross_entropy(
        &logits(&[2, 3]),
        &one_hot,
        &Default::default(),
    ));
    assert!(
        matches!(
            e,
            Error::TargetForm {
                op: "cross_entropy",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(msg.contains("look like one-hot vectors"), "{msg}");
    assert!(msg.contains("class indices of shape [2]"), "{msg}");
    assert!(msg.contains("target.argmax(1, false)"), "{msg}");
    assert!(msg.contains("to_dtype(DType::F32)"), "{msg}");
}

#[test]
fn float_probability_targets_are_accepted_by_cross_entropy() {
    // Not a mix-up: PyTorch takes class probabilities of the logits' shape.
    let probs =
        Tensor::from_slice(&[1.0f32, 0.0, 0.0, 0.0, 0.5, 0.5], &[2, 3], Device::Cpu).unwrap();
    let loss = cross_entropy(&logits(&[2, 3]), &probs, &Default::default()).unwrap();
    assert!(loss.item().unwrap() > 0.0);
}

#[test]
fn float_one_hot_targets_for_nll_loss_explain_argmax_and_cross_entropy() {
    let one_hot =
        Tensor::from_slice(&[0.0f32, 1.0, 0.0, 1.0, 0.0, 0.0], &[2, 3], Device::Cpu).unwrap();
    let (e, msg) = err(nll_loss(&logits(&[2, 3]), &one_hot, &Default::default()));
    assert!(
        matches!(e, Error::TargetForm { op: "nll_loss", .. }),
        "{e:?}"
    );
    assert!(
        msg.contains("one-hot vectors or class probabilities"),
        "{msg}"
    );
    assert!(msg.contains("integer class indices of shape [2]"), "{msg}");
    assert!(msg.contains("target.argmax(1, false)"), "{msg}");
    assert!(msg.contains("cross_entropy"), "{msg}");
}

#[test]
fn float_class_indices_explain_to_dtype_i64() {
    let idx = Tensor::from_slice(&[2.0f32, 0.0], &[2], Device::Cpu).unwrap();
    let (e, msg) = err(cross_entropy(&logits(&[2, 3]), &idx, &Default::default()));
    assert!(matches!(e, Error::TargetForm { .. }), "{e:?}");
    assert!(msg.contains("class indices stored as floats"), "{msg}");
    assert!(msg.contains("to_dtype(DType::I64)"), "{msg}");
}

#[test]
fn class_indices_for_mse_explain_one_hot() {
    let (e, msg) = err(mse_loss(
        &logits(&[4, 3]),
        &ints(&[0, 2, 1, 1], &[4]),
        Reduction::Mean,
    ));
    assert!(
        matches!(e, Error::TargetForm { op: "mse_loss", .. }),
        "{e:?}"
    );
    assert!(msg.contains("look like class indices"), "{msg}");
    assert!(msg.contains("input's shape [4, 3]"), "{msg}");
    assert!(
        msg.contains("one_hot(target, Some(3))?.to_dtype(DType::F32)"),
        "{msg}"
    );
    // The same [N] shape as floats: still indices, with the conversion through I64 first.
    let f = Tensor::from_slice(&[0.0f32, 2.0, 1.0, 1.0], &[4], Device::Cpu).unwrap();
    let (_, msg) = err(l1_loss(&logits(&[4, 3]), &f, Reduction::Mean));
    assert!(
        msg.contains("one_hot(&target.to_dtype(DType::I64)?, Some(3))"),
        "{msg}"
    );
}

#[test]
fn integer_targets_of_the_right_shape_for_mse_explain_to_dtype() {
    let (e, msg) = err(mse_loss(
        &logits(&[2, 2]),
        &ints(&[0, 1, 1, 0], &[2, 2]),
        Reduction::Sum,
    ));
    assert!(matches!(e, Error::DType { .. }), "{e:?}");
    assert!(msg.contains("got int64 targets for float32 input"), "{msg}");
    assert!(msg.contains("target.to_dtype(DType::F32)"), "{msg}");
}

#[test]
fn out_of_range_targets_name_the_first_bad_value_and_position() {
    let t = ints(&[0, 2, 5, -1], &[4]);
    let (e, msg) = err(cross_entropy(&logits(&[4, 3]), &t, &Default::default()));
    match e {
        Error::TargetOutOfRange {
            value,
            position,
            classes,
            ..
        } => {
            assert_eq!((value, position, classes), (5, vec![2], 3));
        }
        other => panic!("{other:?}"),
    }
    assert!(
        msg.contains("target 5 at position [2] is out of range for 3 classes"),
        "{msg}"
    );
    assert!(
        msg.contains("[0, 3), or equal ignore_index (-100)"),
        "{msg}"
    );
    // Spatial targets: the position is in the target's own coordinates.
    let t = ints(&[0, 1, 1, 0, 2, 7], &[1, 2, 3]);
    let (e, _) = err(cross_entropy(
        &logits(&[1, 3, 2, 3]),
        &t,
        &Default::default(),
    ));
    assert!(
        matches!(e, Error::TargetOutOfRange { value: 7, ref position, .. } if position == &[0, 1, 2]),
        "{e:?}"
    );
    // nll_loss reports the same way (negative values other than ignore_index are bad too).
    let (e, msg) = err(nll_loss(
        &logits(&[2, 3]),
        &ints(&[-1, 0], &[2]),
        &Default::default(),
    ));
    assert!(
        matches!(e, Error::TargetOutOfRange { value: -1, .. }),
        "{e:?}"
    );
    assert!(msg.contains("position [0]"), "{msg}");
    // The first value past the last class, in both losses.
    let t = ints(&[1, 3], &[2]);
    let (e, _) = err(nll_loss(&logits(&[2, 3]), &t, &Default::default()));
    assert!(
        matches!(e, Error::TargetOutOfRange { value: 3, ref position, classes: 3, .. } if position == &[1]),
        "{e:?}"
    );
    let (e, _) = err(cross_entropy(&logits(&[2, 3]), &t, &Default::default()));
    assert!(
        matches!(e, Error::TargetOutOfRange { value: 3, ref position, classes: 3, .. } if position == &[1]),
        "{e:?}"
    );
}

#[test]
fn shape_mismatches_name_both_shapes() {
    let (e, msg) = err(cross_entropy(
        &logits(&[4, 3]),
        &ints(&[0, 1, 2], &[3]),
        &Default::default(),
    ));
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    assert!(
        msg.contains("target shape [3] does not fit input shape [4, 3]"),
        "{msg}"
    );
    assert!(msg.contains("class indices of shape [4]"), "{msg}");
    let (e, msg) = err(mse_loss(
        &logits(&[4, 3]),
        &logits(&[3, 4]),
        Reduction::Mean,
    ));
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    assert!(
        msg.contains("input shape [4, 3] and target shape [3, 4] differ"),
        "{msg}"
    );
    let w = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    let opts = CrossEntropyOptions {
        weight: Some(&w),
        ..Default::default()
    };
    let (_, msg) = err(cross_entropy(
        &logits(&[4, 3]),
        &ints(&[0, 1, 2, 0], &[4]),
        &opts,
    ));
    assert!(
        msg.contains("weight shape [4] does not fit input shape [4, 3]"),
        "{msg}"
    );
    assert!(msg.contains("need shape [3]"), "{msg}");
}

#[test]
fn size_one_class_dim_mismatch_suggests_unsqueeze() {
    let x = Tensor::from_slice(&[0.2f32, 0.7], &[2, 1], Device::Cpu).unwrap();
    let y = Tensor::from_slice(&[0.0f32, 1.0], &[2], Device::Cpu).unwrap();
    let (e, msg) = err(binary_cross_entropy(&x, &y, &Default::default()));
    assert!(matches!(e, Error::Shape { .. }), "{e:?}");
    assert!(msg.contains("target.unsqueeze(1)"), "{msg}");
}

#[test]
fn invalid_options_say_what_range_is_allowed() {
    let t = ints(&[0, 1], &[2]);
    let opts = CrossEntropyOptions {
        label_smoothing: 1.5,
        ..Default::default()
    };
    let (e, msg) = err(cross_entropy(&logits(&[2, 3]), &t, &opts));
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(
        msg.contains("label_smoothing must lie in [0, 1], got 1.5"),
        "{msg}"
    );
    // 1.0 is allowed (as in PyTorch): the target is uniform, the loss -mean(log_softmax).
    let opts = CrossEntropyOptions {
        label_smoothing: 1.0,
        ..Default::default()
    };
    let loss = cross_entropy(&logits(&[2, 3]), &t, &opts).unwrap();
    // Both rows are [0, 0.1, 0.2] up to a shift, which log_softmax ignores.
    let lse = [0.0f64, 0.1, 0.2].iter().map(|v| v.exp()).sum::<f64>().ln();
    let got = loss.to_vec::<f32>().unwrap()[0] as f64;
    assert!((got - (lse - 0.1)).abs() < 1e-6, "{got}");
    let x = logits(&[2, 2]);
    let (_, msg) = err(smooth_l1_loss(&x, &x, Reduction::Mean, -1.0));
    assert!(
        msg.contains("beta must be a finite number >= 0, got -1"),
        "{msg}"
    );
    let (_, msg) = err(huber_loss(&x, &x, Reduction::Mean, 0.0));
    assert!(
        msg.contains("delta must be a finite number > 0, got 0"),
        "{msg}"
    );
    // Hostile values are echoed in short form, not as 301 digits.
    let (_, msg) = err(smooth_l1_loss(&x, &x, Reduction::Mean, -1e300));
    assert!(msg.contains("got -1e300;"), "{msg}");
    let (_, msg) = err(huber_loss(&x, &x, Reduction::Mean, -1e300));
    assert!(msg.contains("got -1e300;"), "{msg}");
    let p = Tensor::from_slice(&[0.5f32, 1.5], &[2], Device::Cpu).unwrap();
    let (_, msg) = err(binary_cross_entropy(&p, &p, &Default::default()));
    assert!(
        msg.contains("must be a probability in [0, 1], got values in [0.5, 1.5]"),
        "{msg}"
    );
    assert!(msg.contains("binary_cross_entropy_with_logits"), "{msg}");
    // A weight may broadcast to the input, never the input to a larger weight.
    let q = Tensor::from_slice(&[0.5f32, 0.25], &[2], Device::Cpu).unwrap();
    let w = logits(&[3, 2]);
    let opts = BceOptions {
        weight: Some(&w),
        ..Default::default()
    };
    let (_, msg) = err(binary_cross_entropy(&q, &q, &opts));
    assert!(
        msg.contains("weight shape [3, 2] does not broadcast to input shape [2]"),
        "{msg}"
    );
}

#[test]
fn wrong_dtypes_say_how_to_convert() {
    let (e, msg) = err(cross_entropy(
        &ints(&[1, 2], &[1, 2]),
        &ints(&[0], &[1]),
        &Default::default(),
    ));
    assert!(matches!(e, Error::DType { .. }), "{e:?}");
    assert!(msg.contains("must be floating point, got int64"), "{msg}");
    let b = Tensor::zeros(&[2], DType::Bool, Device::Cpu).unwrap();
    let (_, msg) = err(cross_entropy(&logits(&[2, 3]), &b, &Default::default()));
    assert!(msg.contains("got bool targets"), "{msg}");
    let p64 = Tensor::zeros(&[2, 3], DType::F64, Device::Cpu).unwrap();
    let (_, msg) = err(cross_entropy(&logits(&[2, 3]), &p64, &Default::default()));
    assert!(
        msg.contains("class-probability targets must have the input's dtype float32"),
        "{msg}"
    );
    let w64 = Tensor::ones(&[3], DType::F64, Device::Cpu).unwrap();
    for r in [
        cross_entropy(
            &logits(&[2, 3]),
            &ints(&[0, 1], &[2]),
            &CrossEntropyOptions {
                weight: Some(&w64),
                ..Default::default()
            },
        ),
        nll_loss(
            &logits(&[2, 3]),
            &ints(&[0, 1], &[2]),
            &NllLossOptions {
                weight: Some(&w64),
                ..Default::default()
            },
        ),
    ] {
        let (_, msg) = err(r);
        assert!(
            msg.contains("weight dtype float64 differs from the input's float32"),
            "{msg}"
        );
    }
}

#[test]
fn one_hot_rejects_bad_labels_with_value_and_position() {
    let (e, msg) = err(one_hot(&ints(&[0, 1, -3, 2], &[2, 2]), None));
    assert!(
        matches!(e, Error::InvalidLabel { value: -3, ref position, .. } if position == &[1, 0]),
        "{e:?}"
    );
    assert!(
        msg.contains("label -3 at position [1, 0] is negative"),
        "{msg}"
    );
    let (_, msg) = err(one_hot(&ints(&[2, -1], &[2]), Some(3)));
    assert!(
        msg.contains("label -1 at position [1] is negative"),
        "{msg}"
    );
    let (_, msg) = err(one_hot(&ints(&[0, 4, 1], &[3]), Some(3)));
    assert!(
        msg.contains("label 4 at position [1] is out of range for num_classes = 3"),
        "{msg}"
    );
    let (_, msg) = err(one_hot(&ints(&[], &[0]), None));
    assert!(
        msg.contains("cannot infer the number of classes from empty labels"),
        "{msg}"
    );
    let f = Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap();
    let (_, msg) = err(one_hot(&f, Some(2)));
    assert!(
        msg.contains("labels must be integer class indices, got float32"),
        "{msg}"
    );
}

#[test]
fn an_input_without_classes_is_refused_by_both_class_losses() {
    // PyTorch returns 0 for [2, 0] logits when every target is ignored (NaN with smoothing).
    for (shape, labels) in [
        (&[2usize, 0][..], &[-100i64, -100][..]),
        (&[0][..], &[-100][..]),
    ] {
        let t = ints(labels, &shape[..shape.len() - 1]);
        let (_, msg) = err(cross_entropy(&logits(shape), &t, &Default::default()));
        assert!(msg.contains("has no classes: its class dim"), "{msg}");
        assert!(msg.contains(" is empty; pass one score per class"), "{msg}");
        assert!(msg.contains("at least one class"), "{msg}");
        let (_, msg) = err(nll_loss(&logits(shape), &t, &Default::default()));
        assert!(msg.contains("has no classes"), "{msg}");
    }
}
