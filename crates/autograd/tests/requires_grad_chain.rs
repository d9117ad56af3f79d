//! `set_requires_grad` ends a chain that creates a leaf (it returns the tensor, not `()`), and
//! the returned handle is the same leaf: its gradient is the original's.

use kiln_autograd::{Device, Tensor};

#[test]
fn set_requires_grad_chains_and_returns_the_same_leaf() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    assert!(x.requires_grad() && x.is_leaf());
    // In the middle of a chain too: d/dw sum(3 w * x) = 3 x.
    let w = Tensor::from_vec(vec![0.5f32, -1.0, 4.0], &[3], Device::Cpu).unwrap();
    let y = w
        .set_requires_grad(true)
        .unwrap()
        .mul_scalar(3.0)
        .unwrap()
        .mul(&x)
        .unwrap()
        .sum_all()
        .unwrap();
    y.backward().unwrap();
    assert_eq!(
        w.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![3.0, 6.0, 9.0]
    );
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![1.5, -3.0, 12.0]
    );
    // Freezing through the returned handle freezes the original.
    let frozen = w.set_requires_grad(false).unwrap();
    assert!(!frozen.requires_grad() && !w.requires_grad());
    // Errors are unchanged: a non-leaf cannot change requires_grad.
    let msg = y.set_requires_grad(false).unwrap_err().to_string();
    assert!(msg.contains("only leaf tensors"), "{msg}");
}
