//! What the reference-checked targets share: the fixed upstream gradient of their gradient
//! checks, rounding a reference's operand to f32, making a float leaf (or a non-contiguous view
//! of one) and reading its gradient, and comparing a result with its reference.

use kiln::autograd::{DType, Device, Tensor};

/// The upstream gradient `G` at output element `i` of a gradient check (the gradient of
/// `Σ G ⊙ output`): varied, so a gradient sent to the wrong element shows, and the same on
/// every run.
pub fn upstream(i: usize) -> f64 {
    ((i * 7919) % 13) as f64 / 6.0 - 1.0
}

/// `v` as an f32 holds it when `f32`, else `v`.
pub fn round_to(f32: bool, v: f64) -> f64 {
    if f32 {
        v as f32 as f64
    } else {
        v
    }
}

/// A CPU tensor of `values`, F32 or F64, that requires grad when `grad`.
pub fn float_tensor(values: &[f64], shape: &[usize], f32: bool, grad: bool) -> Tensor {
    let t = Tensor::from_vec(values.to_vec(), shape, Device::Cpu).unwrap();
    let dtype = if f32 { DType::F32 } else { DType::F64 };
    t.to_dtype(dtype).unwrap().set_requires_grad(grad).unwrap()
}

/// Asserts that `got` equals `want` element by element: not finite where the reference is NaN
/// or infinite, else within `tol` times the largest finite magnitude of `want` (at least 1).
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let finite = want.iter().filter(|v| v.is_finite());
    let tol = tol * finite.fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= tol
        } else {
            !g.is_finite()
        };
        assert!(ok, "{what}[{i}]: kiln {g}, reference {w}");
    }
}

/// A float leaf holding `values` of `shape` and the tensor an op sees: the leaf itself, or
/// (`strided`, rank 2 or more) a reversed-dims view of a leaf that stores the transposed data,
/// so the op reads the same logical values through other strides. The leaf's gradient is in
/// its own (reversed) layout; [`grad_as_seen`] reads it back in `shape`'s order.
pub fn leaf_and_view(
    values: &[f64],
    shape: &[usize],
    f32: bool,
    strided: bool,
) -> (Tensor, Tensor) {
    if !strided || shape.len() < 2 {
        let t = float_tensor(values, shape, f32, true);
        return (t.clone(), t);
    }
    let rev: Vec<isize> = (0..shape.len() as isize).rev().collect();
    let logical = float_tensor(values, shape, f32, false);
    let stored = logical.permute(&rev).unwrap().contiguous().unwrap();
    let leaf = stored.set_requires_grad(true).unwrap();
    let view = leaf.permute(&rev).unwrap();
    (leaf, view)
}

/// The gradient of a leaf made by [`leaf_and_view`], in the logical order (zeros if none).
pub fn grad_as_seen(leaf: &Tensor, len: usize, strided: bool) -> Vec<f64> {
    match leaf.grad() {
        None => vec![0.0; len],
        Some(g) if strided && g.rank() >= 2 => {
            let rev: Vec<isize> = (0..g.rank() as isize).rev().collect();
            g.permute(&rev).unwrap().to_vec_f64().unwrap()
        }
        Some(g) => g.to_vec_f64().unwrap(),
    }
}
