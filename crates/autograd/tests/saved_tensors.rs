//! What a recorded op keeps for backward: only the tensors a gradient that will be computed
//! reads (PyTorch's rule), so an in-place update of a tensor no gradient reads does not stop a
//! backward, and an activation multiplied by a constant or a mask is not held until backward.
//! The outcomes (`Ok` and the gradient, or the in-place refusal) are PyTorch 2.15's for the
//! same programs, except where a test says kiln's rule differs: a refused backward changes no
//! gradient (PyTorch's has accumulated what ran before the node it refuses), and a second
//! backward through a freed op is refused even when it saved nothing.

use kiln_autograd::{no_grad, Device, Tensor};

fn t(v: &[f64]) -> Tensor {
    Tensor::from_slice(v, &[v.len()], Device::Cpu).unwrap()
}

fn leaf(v: &[f64]) -> Tensor {
    t(v).set_requires_grad(true).unwrap()
}

fn values(x: &Tensor) -> Vec<f64> {
    x.to_vec::<f64>().unwrap()
}

/// Runs `y.backward_with(ones)` and returns the refusal's text, if any.
fn backward(y: &Tensor) -> Option<String> {
    let ones = Tensor::ones_like(y).unwrap();
    y.backward_with(Some(&ones), false)
        .err()
        .map(|e| e.to_string())
}

fn assert_refused(y: &Tensor, node: &str) {
    let e = backward(y).expect("the backward is refused");
    assert!(e.contains(node) && e.contains("modified in place"), "{e}");
}

#[test]
fn a_product_keeps_only_the_operand_the_other_gradient_reads() {
    // x needs no gradient: w's gradient reads x, nothing reads w, so w may change.
    let (x, w) = (t(&[1., 2., 3.]), leaf(&[1., 1., 1.]));
    let y = x.mul(&w).unwrap();
    no_grad(|| w.add_(&t(&[1., 1., 1.]))).unwrap();
    assert_eq!(backward(&y), None);
    assert_eq!(values(&w.grad().unwrap()), [1., 2., 3.]);
    // ...but x may not.
    let (x, w) = (t(&[1., 2., 3.]), leaf(&[1., 1., 1.]));
    let y = x.mul(&w).unwrap();
    x.add_(&t(&[1., 1., 1.])).unwrap();
    assert_refused(&y, "MulBackward");
    // x * x with x needing a gradient keeps x.
    let x = leaf(&[1., 2.]);
    let y = x.mul(&x).unwrap();
    x.detach().add_(&t(&[1., 1.])).unwrap();
    assert_refused(&y, "MulBackward");
}

#[test]
fn a_quotient_keeps_the_divisor_and_the_dividend_only_for_the_divisors_gradient() {
    // x / w, only x needs a gradient: x and the output may change, w may not.
    let (x, w) = (leaf(&[1., 2.]), t(&[2., 4.]));
    let y = x.div(&w).unwrap();
    no_grad(|| {
        x.add_(&t(&[1., 1.]))?;
        y.mul_scalar_(3.0)
    })
    .unwrap();
    assert_eq!(backward(&y), None);
    assert_eq!(values(&x.grad().unwrap()), [0.5, 0.25]);
    let (x, w) = (leaf(&[1., 2.]), t(&[2., 4.]));
    let y = x.div(&w).unwrap();
    w.add_(&t(&[1., 1.])).unwrap();
    assert_refused(&y, "DivBackward");
    // w needs a gradient: x is read too, the output is not
    let (x, w) = (t(&[1., 2.]), leaf(&[2., 4.]));
    let y = x.div(&w).unwrap();
    no_grad(|| y.mul_scalar_(3.0)).unwrap();
    assert_eq!(backward(&y), None);
    assert_eq!(values(&w.grad().unwrap()), [-0.25, -0.125]);
    let (x, w) = (t(&[1., 2.]), leaf(&[2., 4.]));
    let y = x.div(&w).unwrap();
    x.add_(&t(&[1., 1.])).unwrap();
    assert_refused(&y, "DivBackward");
}

#[test]
fn a_matrix_product_keeps_only_the_operand_the_other_gradient_reads() {
    let x = Tensor::from_slice(&[1., 2., 3., 4.], &[2, 2], Device::Cpu).unwrap();
    let w = Tensor::from_slice(&[1., 0., 0., 1.], &[2, 2], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    // a frozen weight: the activation is not kept
    let frozen = w.detach();
    let act = x.copy_data().unwrap().set_requires_grad(true).unwrap();
    let before = act.storage_use_count();
    let y = act.matmul(&frozen).unwrap();
    assert_eq!(act.storage_use_count(), before, "the activation was kept");
    no_grad(|| act.fill_(9.0)).unwrap();
    assert_eq!(backward(&y), None);
    assert_eq!(values(&act.grad().unwrap()), [1., 1., 1., 1.]);
    // a trainable weight on a constant input: the weight may change, the input may not
    let y = x.matmul(&w).unwrap();
    no_grad(|| w.fill_(5.0)).unwrap();
    assert_eq!(backward(&y), None);
    assert_eq!(values(&w.grad().unwrap()), [4., 4., 6., 6.]);
    let y = x.matmul(&w).unwrap();
    x.fill_(0.0).unwrap();
    assert_refused(&y, "MmBackward");
}

#[test]
fn scaling_or_masking_an_activation_does_not_hold_it_until_backward() {
    let x = leaf(&[1., -2., 3.]);
    let h = x.exp().unwrap(); // ExpBackward keeps h
    let kept = h.storage_use_count();
    let scaled = h.mul_scalar(0.5).unwrap();
    let mask = t(&[1., 0., 2.]);
    let masked = h.mul(&mask).unwrap();
    let divided = h.div_scalar(4.0).unwrap();
    assert_eq!(h.storage_use_count(), kept, "a product or quotient kept h");
    assert_eq!(
        divided.storage_use_count(),
        1,
        "the quotient kept its output"
    );
    assert_eq!(
        mask.storage_use_count(),
        2,
        "the product did not keep the mask"
    );
    let y = scaled.add(&masked).unwrap().add(&divided).unwrap();
    assert_eq!(backward(&y), None);
    let e: Vec<f64> = [1f64, -2., 3.].iter().map(|v| v.exp()).collect();
    let want: Vec<f64> = e
        .iter()
        .zip([1., 0., 2.])
        .map(|(e, m)| e * (0.5 + m + 0.25))
        .collect();
    for (g, w) in values(&x.grad().unwrap()).iter().zip(&want) {
        assert!((g - w).abs() <= 1e-14 * w.abs(), "{g} vs {w}");
    }
}

#[test]
fn a_power_keeps_its_output_only_for_the_exponents_gradient() {
    let x = leaf(&[2., 3.]);
    let y = x.pow_scalar(2.0).unwrap();
    assert_eq!(y.storage_use_count(), 1, "pow kept its output");
    no_grad(|| y.fill_(0.0)).unwrap();
    assert_eq!(backward(&y), None);
    assert_eq!(values(&x.grad().unwrap()), [4., 6.]);
    let (x, p) = (t(&[2., 3.]), leaf(&[2., 1.]));
    let y = x.pow(&p).unwrap();
    no_grad(|| y.fill_(0.0)).unwrap();
    assert_refused(&y, "PowBackward");
}

#[test]
fn a_refused_backward_changes_no_gradient() {
    // b * c saved c, which changes: the whole backward is refused, a's path included (the
    // engine would run it first)
    let (a, b, c) = (leaf(&[1., 2.]), leaf(&[3., 4.]), t(&[5., 6.]));
    let y = b.mul(&c).unwrap().add(&a.mul_scalar(2.0).unwrap()).unwrap();
    c.fill_(0.0).unwrap();
    assert_refused(&y, "MulBackward");
    assert!(a.grad().is_none() && b.grad().is_none());
    // a second backward through a freed op: refused before b's gradient grows
    let z = a.exp().unwrap();
    assert_eq!(backward(&z.add(&b).unwrap()), None);
    let e = backward(&z.add(&b.mul_scalar(3.0).unwrap()).unwrap()).expect("refused");
    assert!(
        e.contains("ExpBackward") && e.contains("second time"),
        "{e}"
    );
    assert_eq!(values(&b.grad().unwrap()), [1., 1.]);
    assert_eq!(values(&a.grad().unwrap()), [1f64.exp(), 2f64.exp()]);
    // ...even when the freed op saved nothing (PyTorch runs a sum again)
    let sum = a.add(&b).unwrap();
    assert_eq!(backward(&sum), None);
    let e = backward(&sum).expect("refused");
    assert!(
        e.contains("AddBackward") && e.contains("second time"),
        "{e}"
    );
    assert_eq!(values(&b.grad().unwrap()), [2., 2.]);
}

#[test]
fn narrow_bounds_that_overflow_are_refused() {
    let x = t(&[1., 2., 3.]);
    for (start, len) in [
        (usize::MAX, 2),
        (2, usize::MAX),
        (usize::MAX / 2 + 1, usize::MAX / 2 + 1),
    ] {
        let e = x.narrow(0, start, len).unwrap_err().to_string();
        assert!(e.contains("exceeds size 3"), "{e}");
    }
    assert_eq!(values(&x.narrow(0, 3, 0).unwrap()), [] as [f64; 0]);
}
