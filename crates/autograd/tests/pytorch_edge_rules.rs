//! PyTorch 2.15's rules at the edges of indexing and joining, values and gradients, on every
//! device (the fuzz suite's indexing target found each one missing): `gather` / `scatter` with
//! a 0-d tensor or index (one element of rank 1) or an empty index (no shape checks);
//! out-of-place `masked_fill` broadcasting the tensor with the mask; `cat` skipping 1-D empty
//! tensors; `topk` of a 0-d tensor taking only `k = 1`; training `batch_norm` passing an input
//! with no elements through; `chunk` / `split` / `split_sizes` of empty dims and 0-d tensors;
//! the gradients PyTorch defines where a formula gives NaN or ties (`clamp_min` / `clamp_max`,
//! `pow` with exponent 0, `max()` with NaN, `norm` with zero or NaN elements). Expected values
//! are PyTorch's on the same calls.

mod common;

use common::devices;
use kiln_autograd::{BatchNormOptions, DType, Device, Tensor};

fn floats(values: &[f32], shape: &[usize], device: Device) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape, device).unwrap()
}

fn leaf(values: &[f32], shape: &[usize], device: Device) -> Tensor {
    floats(values, shape, device)
        .set_requires_grad(true)
        .unwrap()
}

fn index(values: &[i64], shape: &[usize], device: Device) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape, device).unwrap()
}

fn mask(values: &[bool], shape: &[usize], device: Device) -> Tensor {
    let v: Vec<f32> = values.iter().map(|&b| b as u8 as f32).collect();
    floats(&v, shape, device).gt_scalar(0.5).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn grad(t: &Tensor) -> Vec<f32> {
    values(&t.grad().expect("a gradient"))
}

/// `Σ w ⊙ y` with `w = 1, 2, 3, ...`, backward.
fn backward_weighted(y: &Tensor) {
    let w: Vec<f32> = (1..=y.numel()).map(|i| i as f32).collect();
    let w = floats(&w, y.shape(), y.device());
    y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
}

#[test]
fn gather_and_scatter_read_a_0d_tensor_as_one_element() {
    for dev in devices() {
        // torch.tensor(5.).gather(0, torch.tensor(0)) == tensor(5.); with index [0, 0]: [5, 5].
        let x = leaf(&[5.0], &[], dev);
        let y = x.gather(0, &index(&[0], &[], dev)).unwrap();
        assert_eq!((y.shape(), values(&y)), (&[] as &[usize], vec![5.0]));
        let y = x.gather(-1, &index(&[0, 0], &[2], dev)).unwrap();
        assert_eq!((y.shape(), values(&y)), (&[2usize][..], vec![5.0, 5.0]));
        backward_weighted(&y);
        assert_eq!(grad(&x), vec![3.0]);
        // torch.arange(3.).gather(0, torch.tensor(2)) == tensor(2.)
        let y = floats(&[0.0, 1.0, 2.0], &[3], dev)
            .gather(0, &index(&[2], &[], dev))
            .unwrap();
        assert_eq!((y.shape(), values(&y)), (&[] as &[usize], vec![2.0]));
        // torch.zeros(3).scatter(0, torch.tensor(2), torch.tensor(5.)) == [0, 0, 5]
        let (x, src) = (leaf(&[0.0; 3], &[3], dev), leaf(&[5.0], &[], dev));
        let y = x.scatter(0, &index(&[2], &[], dev), &src).unwrap();
        assert_eq!(
            (y.shape(), values(&y)),
            (&[3usize][..], vec![0.0, 0.0, 5.0])
        );
        backward_weighted(&y);
        assert_eq!((grad(&x), grad(&src)), (vec![1.0, 2.0, 0.0], vec![3.0]));
        // torch.tensor(1.).scatter_add(0, torch.tensor([0, 0]), torch.tensor([2., 3.])) == 6
        let y = floats(&[1.0], &[], dev)
            .scatter_add(
                0,
                &index(&[0, 0], &[2], dev),
                &floats(&[2.0, 3.0], &[2], dev),
            )
            .unwrap();
        assert_eq!((y.shape(), values(&y)), (&[] as &[usize], vec![6.0]));
        // A 0-d tensor against a 2-D index is still a rank mismatch.
        let e = floats(&[1.0], &[], dev)
            .gather(0, &index(&[0], &[1, 1], dev))
            .unwrap_err();
        assert!(e.to_string().contains("gather"), "{e}");
    }
}

#[test]
fn an_empty_index_skips_the_shape_checks() {
    for dev in devices() {
        let x = leaf(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], dev);
        // torch.zeros(2, 3).gather(1, torch.zeros(9, 0, dtype=torch.long)): shape [9, 0];
        // an index of another rank too (shape [0]).
        let y = x.gather(1, &index(&[], &[9, 0], dev)).unwrap();
        assert_eq!(y.shape(), &[9, 0]);
        assert_eq!(x.gather(1, &index(&[], &[0], dev)).unwrap().shape(), &[0]);
        y.sum_all().unwrap().backward().unwrap();
        assert_eq!(grad(&x), vec![0.0; 6]);
        // torch.zeros(2, 3).scatter(1, torch.zeros(0, 0, dtype=torch.long), torch.ones(3)):
        // a copy of self, src's rank and size unchecked; the copy is its own buffer.
        let src = leaf(&[9.0; 3], &[3], dev);
        let y = x.scatter(1, &index(&[], &[0, 0], dev), &src).unwrap();
        assert_eq!(values(&y), values(&x));
        backward_weighted(&y);
        assert_eq!(grad(&x), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(src.grad().is_none_or(|g| values(&g) == vec![0.0; 3]));
        // The dim is still checked: dim 5 of a 2-D tensor.
        let e = x.gather(5, &index(&[], &[0], dev)).unwrap_err();
        assert!(e.to_string().contains("dim 5 is out of range"), "{e}");
        let e = x.scatter_add(-3, &index(&[], &[0], dev), &src).unwrap_err();
        assert!(e.to_string().contains("dim -3 is out of range"), "{e}");
    }
}

#[test]
fn masked_fill_broadcasts_the_tensor_with_the_mask() {
    for dev in devices() {
        // torch.ones(3).masked_fill(torch.tensor([[True], [False]]), 0.) ==
        // [[0, 0, 0], [1, 1, 1]]
        let x = leaf(&[1.0, 2.0, 3.0], &[3], dev);
        let y = x
            .masked_fill(&mask(&[true, false], &[2, 1], dev), 0.0)
            .unwrap();
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(values(&y), vec![0.0, 0.0, 0.0, 1.0, 2.0, 3.0]);
        // The gradient sums over the broadcast rows that were not filled: weights 4, 5, 6.
        backward_weighted(&y);
        assert_eq!(grad(&x), vec![4.0, 5.0, 6.0]);
        // A 0-d tensor under a [1] mask: torch.tensor(1.).masked_fill(torch.tensor([True]), 3.)
        let y = floats(&[1.0], &[], dev)
            .masked_fill(&mask(&[true], &[1], dev), 3.0)
            .unwrap();
        assert_eq!((y.shape(), values(&y)), (&[1usize][..], vec![3.0]));
    }
}

#[test]
fn cat_skips_1d_empty_tensors() {
    for dev in devices() {
        // torch.cat([torch.tensor([]), x, torch.tensor([])], 1) == x for a [2, 2] x, and the
        // gradient reaches x.
        let empty = leaf(&[], &[0], dev);
        let x = leaf(&[1.0, 2.0, 3.0, 4.0], &[2, 2], dev);
        let y = Tensor::cat(&[empty.clone(), x.clone(), empty.clone()], 1).unwrap();
        assert_eq!((y.shape(), values(&y)), (&[2usize, 2][..], values(&x)));
        backward_weighted(&y);
        assert_eq!(grad(&x), vec![1.0, 2.0, 3.0, 4.0]);
        // Only empty ones: the result is one, whatever the dim (torch.cat([e, e], 3)).
        let y = Tensor::cat(&[empty.clone(), empty.clone()], 3).unwrap();
        assert_eq!(y.shape(), &[0]);
        // A [0, 2] tensor is not skipped: its other dims must match.
        let e = Tensor::cat(&[floats(&[], &[0, 3], dev), x.clone()], 0).unwrap_err();
        assert!(
            e.to_string()
                .contains("tensor 1 has shape [2, 2] but tensor 0 has [0, 3]"),
            "{e}"
        );
        // The dim is checked against the first tensor not skipped, and a 0-d one anywhere is
        // named.
        let e = Tensor::cat(&[empty.clone(), x.clone()], 2).unwrap_err();
        assert!(e.to_string().contains("dim 2 is out of range"), "{e}");
        let e = Tensor::cat(&[empty.clone(), floats(&[1.0], &[], dev)], 0).unwrap_err();
        assert!(e.to_string().contains("tensor 1 is 0-d"), "{e}");
    }
}

#[test]
fn topk_of_a_0d_tensor_takes_k_1_only() {
    let x = Tensor::from_vec(vec![4.0f64], &[], Device::Cpu).unwrap();
    let (v, i) = x.topk(1, 0, true, true).unwrap();
    assert_eq!(
        (v.item().unwrap(), i.to_vec::<i64>().unwrap()),
        (4.0, vec![0])
    );
    // PyTorch returns the element for k = 0 as well; kiln refuses rather than hand back more
    // than was asked for.
    let e = x.topk(0, 0, true, true).unwrap_err().to_string();
    assert!(
        e.contains("a 0-d tensor holds one element, so k must be 1, got 0"),
        "{e}"
    );
    assert!(x
        .to_dtype(DType::F32)
        .unwrap()
        .topk(2, -1, false, true)
        .is_err());
}

#[test]
fn training_batch_norm_passes_an_empty_batch_through() {
    for dev in devices() {
        // F.batch_norm(torch.zeros(0, 3, 4, 4), rm, rv, w, b, training=True): an empty output,
        // rm and rv untouched, zero gradients for w and b; [2, 3, 0] likewise.
        let (rm, rv) = (floats(&[1.0; 3], &[3], dev), floats(&[2.0; 3], &[3], dev));
        let (w, b) = (leaf(&[1.0; 3], &[3], dev), leaf(&[0.0; 3], &[3], dev));
        for shape in [&[0, 3, 4, 4][..], &[2, 3, 0]] {
            let x = leaf(&[], shape, dev);
            let y = x
                .batch_norm(
                    Some(&rm),
                    Some(&rv),
                    Some(&w),
                    Some(&b),
                    BatchNormOptions::default(),
                )
                .unwrap();
            assert_eq!(y.shape(), shape);
            y.sum_all().unwrap().backward().unwrap();
            assert_eq!((values(&rm), values(&rv)), (vec![1.0; 3], vec![2.0; 3]));
            assert_eq!((grad(&w), grad(&b)), (vec![0.0; 3], vec![0.0; 3]));
            assert_eq!(x.grad().unwrap().shape(), shape);
        }
        // One value per channel still has no variance.
        let e = floats(&[1.0, 2.0, 3.0], &[1, 3], dev)
            .batch_norm(
                Some(&rm),
                Some(&rv),
                None,
                None,
                BatchNormOptions::default(),
            )
            .unwrap_err();
        assert!(
            e.to_string().contains("more than 1 value per channel"),
            "{e}"
        );
    }
}

#[test]
fn splits_of_empty_dims_and_0d_tensors() {
    let shapes = |v: Vec<Tensor>| v.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>();
    let empty = Tensor::zeros(&[0, 2], DType::F32, Device::Cpu).unwrap();
    // torch.ones(0, 2).chunk(3) is three [0, 2] pieces; .split(2) and .split(0) one.
    assert_eq!(shapes(empty.chunk(3, 0).unwrap()), vec![vec![0, 2]; 3]);
    assert_eq!(shapes(empty.split(2, 0).unwrap()), vec![vec![0, 2]]);
    assert_eq!(shapes(empty.split(0, 0).unwrap()), vec![vec![0, 2]]);
    // torch.ones(6).chunk(4) is three pieces of 2.
    let six = Tensor::zeros(&[6], DType::F32, Device::Cpu).unwrap();
    assert_eq!(shapes(six.chunk(4, 0).unwrap()), vec![vec![2]; 3]);
    let e = six.split(0, 0).unwrap_err().to_string();
    assert!(
        e.contains("split size must be at least 1 for dim 0 of size 6"),
        "{e}"
    );
    // A hostile count of empty chunks is refused, not allocated.
    let e = empty.chunk(usize::MAX, 0).unwrap_err().to_string();
    assert!(e.contains("empty tensors (at most 65536)"), "{e}");
    // 0-d tensors have no dim to split (these indexed an empty shape and panicked).
    let scalar = Tensor::zeros(&[], DType::F32, Device::Cpu).unwrap();
    for e in [
        scalar.chunk(1, 0).unwrap_err(),
        scalar.split(1, 0).unwrap_err(),
        scalar.split_sizes(&[1], -1).unwrap_err(),
    ] {
        assert!(
            e.to_string().contains("a 0-d tensor has no dim to split"),
            "{e}"
        );
    }
    // Sizes whose sum overflows are refused (the sum panicked in debug builds).
    let e = six
        .split_sizes(&[usize::MAX, 7], 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("add up to more than usize::MAX"), "{e}");
    // flatten of a 0-d tensor still checks its dims: 0 and -1 only.
    assert_eq!(scalar.flatten(-1, 0).unwrap().shape(), &[1]);
    assert!(scalar.flatten(5, 7).is_err());
}

/// Values and the gradient of their sum.
type Outputs = (Vec<f64>, Vec<f64>);

/// `(values, gradient of sum(y))` of `f` on an f64 leaf holding `v`.
fn value_and_grad(v: &[f64], f: impl Fn(&Tensor) -> Tensor) -> Outputs {
    let x = Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let y = f(&x);
    y.sum_all().unwrap().backward().unwrap();
    (
        y.to_vec_f64().unwrap(),
        x.grad().unwrap().to_vec_f64().unwrap(),
    )
}

fn same(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g == w || (g.is_nan() && w.is_nan()))
}

#[test]
fn gradients_where_the_formulas_give_nan_or_ties_are_pytorchs() {
    let nan = f64::NAN;
    let cases: Vec<(&str, Outputs, Outputs)> = vec![
        // x.clamp_min(2.) at [2, 1, 3, nan]: [2, 2, 3, nan], gradient [0, 0, 1, 0].
        (
            "clamp_min",
            value_and_grad(&[2.0, 1.0, 3.0, nan], |x| x.maximum_scalar(2.0).unwrap()),
            (vec![2.0, 2.0, 3.0, nan], vec![0.0, 0.0, 1.0, 0.0]),
        ),
        (
            "clamp_max",
            value_and_grad(&[2.0, 1.0, 3.0], |x| x.minimum_scalar(2.0).unwrap()),
            (vec![2.0, 1.0, 2.0], vec![0.0, 1.0, 0.0]),
        ),
        // x.pow(0.) at [0, nan, inf]: ones, gradient 0 (the formula gives 0 * inf or NaN).
        (
            "pow 0",
            value_and_grad(&[0.0, nan, f64::INFINITY], |x| x.pow_scalar(0.0).unwrap()),
            (vec![1.0; 3], vec![0.0; 3]),
        ),
        // x.max() at [nan, 1, nan]: nan, the gradient split between the NaNs.
        (
            "max()",
            value_and_grad(&[nan, 1.0, nan], |x| x.max_all().unwrap()),
            (vec![nan], vec![0.5, 0.0, 0.5]),
        ),
        // x.norm(0.5) at [0, -2, 1]: the zero element gets 0, not 0 * inf.
        (
            "norm 0.5",
            value_and_grad(&[0.0, -2.0, 1.0], |x| x.norm(0.5, &[], false).unwrap()),
            (
                vec![(2f64.sqrt() + 1.0).powi(2)],
                vec![0.0, -(1.0 + 0.5f64.sqrt()), 1.0 + 2f64.sqrt()],
            ),
        ),
        // x.norm(1) at [-1, nan, 2]: nan, gradient [-1, 0, 1].
        (
            "norm 1",
            value_and_grad(&[-1.0, nan, 2.0], |x| x.norm(1.0, &[], false).unwrap()),
            (vec![nan], vec![-1.0, 0.0, 1.0]),
        ),
        // x.norm(inf) at [-1, nan, -1]: nan, gradient 0.
        (
            "norm inf",
            value_and_grad(&[-1.0, nan, -1.0], |x| {
                x.norm(f64::INFINITY, &[], false).unwrap()
            }),
            (vec![nan], vec![0.0; 3]),
        ),
    ];
    for (name, (v, g), (want_v, want_g)) in cases {
        assert!(same(&v, &want_v), "{name}: value {v:?}, PyTorch {want_v:?}");
        let close = g.iter().zip(&want_g).all(|(a, b)| (a - b).abs() < 1e-12);
        assert!(
            close && g.len() == want_g.len(),
            "{name}: gradient {g:?}, PyTorch {want_g:?}"
        );
    }
}
