//! `Tensor::record_op`: differentiable ops defined outside kiln-autograd.

use kiln_autograd::{no_grad, DType, Device, Tensor};
use kiln_device::prelude::*;

/// `y = x³` with a hand-written backward `3x² g`, its forward run through the backend seam.
fn cube(x: &Tensor) -> kiln_autograd::Result<Tensor> {
    let y = no_grad(|| x.mul(x)?.mul(x))?;
    let fresh = {
        let storage = y.storage_read();
        Tensor::from_storage_contiguous(storage.copy_contiguous(y.layout())?, y.shape())?
    };
    Ok(Tensor::record_op("CubeBackward", &[x], &fresh, |needs| {
        assert_eq!(needs, &[true]);
        let saved = x.save_for_backward();
        Box::new(move |g| Ok(vec![Some(g.mul(&saved.mul(&saved)?.mul_scalar(3.0)?)?)]))
    }))
}

#[test]
fn recorded_ops_run_their_backward_and_check_saved_versions() {
    let x = Tensor::from_slice(&[1.0f64, -2.0, 0.5], &[3], Device::Cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let y = cube(&x).unwrap();
    assert_eq!(y.grad_fn_name(), Some("CubeBackward"));
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![1.0, -8.0, 0.125]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![3.0, 12.0, 0.75]
    );

    // No node without grad; a saved input modified in place is refused in backward.
    let plain = Tensor::ones(&[2], DType::F64, Device::Cpu).unwrap();
    assert!(cube(&plain).unwrap().grad_fn_name().is_none());
    let leaf = Tensor::ones(&[2], DType::F64, Device::Cpu).unwrap();
    leaf.set_requires_grad(true).unwrap();
    let base = leaf.mul_scalar(1.0).unwrap();
    let y = cube(&base).unwrap();
    no_grad(|| base.add_(&Tensor::ones(&[2], DType::F64, Device::Cpu).unwrap())).unwrap();
    let err = y.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(err.contains("modified in place"), "{err}");
    // The buffer must match the shape.
    let storage = plain
        .storage_read()
        .copy_contiguous(plain.layout())
        .unwrap();
    let err = Tensor::from_storage_contiguous(storage, &[3])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a buffer of 2 elements cannot back shape [3]"),
        "{err}"
    );
}
