//! In-place updates: they write through views, bump the version counter, refuse tensors that
//! require grad outside no_grad, and make a backward that saved the old values fail loudly.

use kiln_autograd::{no_grad, DType, Device, Parameter, Tensor};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

/// An out-of-place arithmetic op and its in-place twin.
type Pair = (
    fn(&Tensor, &Tensor) -> kiln_autograd::Result<Tensor>,
    fn(&Tensor, &Tensor) -> kiln_autograd::Result<()>,
);

/// `add`/`add_`, `sub`/`sub_`, `mul`/`mul_`, `div`/`div_`.
fn arithmetic_pairs() -> [Pair; 4] {
    [
        (Tensor::add, Tensor::add_),
        (Tensor::sub, Tensor::sub_),
        (Tensor::mul, Tensor::mul_),
        (Tensor::div, Tensor::div_),
    ]
}

/// The bits of every element as f64 (exact for every float dtype), every NaN as 1.
fn bits(x: &Tensor) -> Vec<u64> {
    let v = x.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    v.iter()
        .map(|v| if v.is_nan() { 1 } else { v.to_bits() })
        .collect()
}

#[test]
fn writes_go_through_views_and_bump_the_version() {
    let x = Tensor::zeros(&[2, 3], DType::F64, Device::Cpu).unwrap();
    let col = x.narrow(1, 1, 1).unwrap();
    assert_eq!(x.version(), 0);
    col.fill_(5.0).unwrap();
    assert_eq!(x.to_vec::<f64>().unwrap(), vec![0., 5., 0., 0., 5., 0.]);
    assert_eq!((x.version(), col.version()), (1, 1));
    x.select(0, 1)
        .unwrap()
        .copy_(&t(&[1., 2., 3.], &[3]))
        .unwrap();
    x.add_(&t(&[10.], &[1])).unwrap();
    assert_eq!(
        x.to_vec::<f64>().unwrap(),
        vec![10., 15., 10., 11., 12., 13.]
    );
    x.mul_scalar_(2.0).unwrap();
    x.add_scaled_(
        &Tensor::ones(&[2, 3], DType::F64, Device::Cpu).unwrap(),
        -20.0,
    )
    .unwrap();
    assert_eq!(x.to_vec::<f64>().unwrap(), vec![0., 10., 0., 2., 4., 6.]);
    assert!(
        x.copy_(&t(&[1., 2.], &[2])).is_err(),
        "shape [2] does not broadcast to [2, 3]"
    );
}

#[test]
fn overlapping_source_is_read_before_it_is_overwritten() {
    let m = t(&[1., 2., 3., 4.], &[2, 2]);
    m.copy_(&m.t().unwrap()).unwrap();
    assert_eq!(m.to_vec::<f64>().unwrap(), vec![1., 3., 2., 4.]);
}

#[test]
fn parameters_update_only_under_no_grad() {
    let p = Parameter::new(t(&[1., 2.], &[2])).unwrap();
    let e = p.sub_(&t(&[1., 1.], &[2])).unwrap_err().to_string();
    assert!(e.contains("no_grad"), "{e}");
    no_grad(|| p.sub_(&t(&[0.5, 0.5], &[2]))).unwrap();
    assert_eq!(p.to_vec::<f64>().unwrap(), vec![0.5, 1.5]);
    assert!(p.requires_grad());
}

#[test]
fn backward_refuses_saved_tensors_modified_in_place() {
    let w = Parameter::new(t(&[2., 3.], &[2])).unwrap();
    let x = t(&[1., 1.], &[2]);
    let y = w.mul(&x).unwrap().sum_all().unwrap(); // MulBackward saved x
    x.fill_(7.0).unwrap();
    let e = y.backward().unwrap_err().to_string();
    assert!(
        e.contains("MulBackward") && e.contains("modified in place"),
        "{e}"
    );
    // add saves nothing, so modifying its input afterwards is fine
    let z = w.add(&x).unwrap().sum_all().unwrap();
    x.fill_(1.0).unwrap();
    z.backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), vec![1., 1.]);
}

#[test]
fn copy_data_is_a_differentiable_deep_copy() {
    let w = Parameter::new(t(&[2., 3.], &[2])).unwrap();
    let c = w.copy_data().unwrap();
    assert!(!c.shares_storage_with(&w));
    c.mul(&c).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().to_vec::<f64>().unwrap(), vec![4., 6.]);
    no_grad(|| c.detach().fill_(0.0)).unwrap();
    assert_eq!(w.to_vec::<f64>().unwrap(), vec![2., 3.]);
}

/// The arithmetic updates on every path of the in-place kernel: a contiguous destination with a
/// broadcast right operand, a transposed (strided) destination, a right operand that is the
/// destination itself, half precision, integers, and a right operand of another dtype.
#[test]
fn arithmetic_updates_match_the_out_of_place_ops() {
    let x = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let row = t(&[10., 20., 30.], &[3]);
    x.add_(&row).unwrap();
    x.sub_(&t(&[1.], &[1])).unwrap();
    x.mul_(&t(&[2., 3.], &[2, 1])).unwrap();
    x.div_(&t(&[4.], &[])).unwrap();
    assert_eq!(
        x.to_vec::<f64>().unwrap(),
        vec![5., 10.5, 16., 39. / 4., 72. / 4., 105. / 4.]
    );
    // A transposed view: element (i, j) of the view is element (j, i) of the buffer.
    let m = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let mt = m.t().unwrap();
    mt.add_(&t(&[100., 200.], &[2])).unwrap();
    assert_eq!(
        m.to_vec::<f64>().unwrap(),
        vec![101., 102., 103., 204., 205., 206.]
    );
    // The right operand is the destination: read before it is overwritten.
    let s = t(&[1., 2., 3.], &[3]);
    s.mul_(&s).unwrap();
    s.add_(&s.narrow(0, 0, 1).unwrap()).unwrap(); // adds the old s[0] to every element
    assert_eq!(s.to_vec::<f64>().unwrap(), vec![2., 5., 10.]);
    // f16 and bf16 compute in f32 and round once, as the out-of-place op does: bit for bit,
    // for every arithmetic op, over values that round, overflow, underflow and divide by zero,
    // with a broadcast right operand.
    let values: Vec<f64> = (0..96)
        .map(|i| {
            let v = ((i * 37) % 97) as f64 * 0.173 - 8.1;
            match i % 12 {
                0 => v * 3.0e4,
                1 => v * 1.0e-6,
                2 => 0.0,
                _ => v,
            }
        })
        .collect();
    for dtype in [DType::F16, DType::BF16] {
        let lhs = t(&values, &[8, 12]).to_dtype(dtype).unwrap();
        let row = t(&values[..12], &[1, 12]).to_dtype(dtype).unwrap();
        for (k, (out_of_place, in_place)) in arithmetic_pairs().into_iter().enumerate() {
            let want = out_of_place(&lhs, &row).unwrap();
            let h = lhs.copy_data().unwrap();
            in_place(&h, &row).unwrap();
            assert_eq!(bits(&h), bits(&want), "{dtype} op {k}");
        }
    }
    for dtype in [DType::F16, DType::BF16] {
        let h = t(&[1.5, -2.25, 1000.0], &[3]).to_dtype(dtype).unwrap();
        let want = h.mul_scalar(3.1).unwrap().to_dtype(DType::F64).unwrap();
        h.mul_scalar_(3.1).unwrap();
        assert_eq!(
            h.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            want.to_vec::<f64>().unwrap()
        );
    }
    // i64: wrapping, and division by zero gives 0 as the out-of-place op does.
    let i = Tensor::from_vec(vec![7i64, -7, i64::MAX], &[3], Device::Cpu).unwrap();
    i.add_(&Tensor::from_vec(vec![1i64, 1, 1], &[3], Device::Cpu).unwrap())
        .unwrap();
    i.div_(&Tensor::from_vec(vec![2i64, 0, 1], &[3], Device::Cpu).unwrap())
        .unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![4, 0, i64::MIN]);
    // f32 scaled: add_scaled_ is add_(alpha * other).
    let f = Tensor::from_vec(vec![1f32, 2.0], &[2], Device::Cpu).unwrap();
    f.add_scaled_(
        &Tensor::from_vec(vec![0.5f32, 0.25], &[2], Device::Cpu).unwrap(),
        -2.0,
    )
    .unwrap();
    assert_eq!(f.to_vec::<f32>().unwrap(), vec![0.0, 1.5]);
    // Another dtype takes the out-of-place path and its rules: refused by name.
    let e = f.add_(&t(&[1., 1.], &[2])).unwrap_err().to_string();
    assert!(e.contains("dtypes differ"), "{e}");
}

/// Strided destinations (a transposed view, a column block, a row block of a transposed view)
/// are updated in place element by element: bit for bit what the out-of-place op gives on the
/// view, every element outside the view untouched, in every dtype the ops take.
#[test]
fn strided_destinations_update_in_place_bit_for_bit() {
    let values: Vec<f64> = (0..96)
        .map(|i| ((i * 37) % 97) as f64 * 0.173 - 8.1)
        .collect();
    type View = fn(&Tensor) -> Tensor;
    let views: [(&str, View); 3] = [
        ("t()", |x| x.t().unwrap()),
        ("narrow(1, 2, 5)", |x| x.narrow(1, 2, 5).unwrap()),
        ("t().narrow(0, 3, 4)", |x| {
            x.t().unwrap().narrow(0, 3, 4).unwrap()
        }),
    ];
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
        let base = t(&values, &[8, 12]).to_dtype(dtype).unwrap();
        for (name, view) in views {
            let shape = view(&base).shape().to_vec();
            // A right operand broadcast along the view's rows, no zero in it (i64 division).
            let rhs: Vec<f64> = (0..shape[1]).map(|j| j as f64 * 1.7 + 1.3).collect();
            let rhs = t(&rhs, &[1, shape[1]]).to_dtype(dtype).unwrap();
            for (k, (out_of_place, in_place)) in arithmetic_pairs().into_iter().enumerate() {
                let want = out_of_place(&view(&base), &rhs).unwrap();
                let buffer = base.copy_data().unwrap();
                in_place(&view(&buffer), &rhs).unwrap();
                let what = format!("{dtype} {name} op {k}");
                assert_eq!(bits(&view(&buffer)), bits(&want), "{what}");
                // Outside the view: write the original values back through the view and the
                // whole buffer must equal the original.
                view(&buffer).copy_(&view(&base)).unwrap();
                assert_eq!(bits(&buffer), bits(&base), "{what}: outside the view");
            }
        }
    }
}

/// An expanded view holds one place for several elements: writing into it is refused, naming
/// the fix, and nothing is written.
#[test]
fn an_expanded_destination_is_refused() {
    let base = t(&[1., 2., 3.], &[3]);
    let wide = base.expand(&[2, 3]).unwrap();
    for result in [
        wide.add_(&t(&[1.], &[1])),
        wide.mul_scalar_(2.0),
        wide.copy_(&t(&[0.; 6], &[2, 3])),
    ] {
        let e = result.unwrap_err().to_string();
        assert!(
            e.contains("expanded view") && e.contains("copy_data"),
            "{e}"
        );
    }
    assert_eq!(base.to_vec::<f64>().unwrap(), vec![1., 2., 3.]);
    assert_eq!(base.version(), 0);
}

/// A second backward adds into the gradient the parameter holds; a gradient the caller still
/// holds keeps its values (the sum goes to a new buffer then, as in PyTorch).
#[test]
fn gradients_accumulate_in_place_unless_someone_holds_them() {
    let w = Parameter::new(t(&[2., 3.], &[2])).unwrap();
    let x = t(&[1., 10.], &[2]);
    let step = || w.mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    step();
    let key = w.grad().unwrap().storage_key();
    step();
    let g = w.grad().unwrap();
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![2., 20.]);
    assert_eq!(g.storage_key(), key, "the second backward added in place");
    step(); // `g` is held: the sum is a new buffer and `g` keeps its values
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![2., 20.]);
    let now = w.grad().unwrap();
    assert_eq!(now.to_vec::<f64>().unwrap(), vec![3., 30.]);
    assert_ne!(now.storage_key(), key);
}

#[test]
fn relu_in_place_gives_relus_bits_on_every_dtype_and_view() {
    let v = [
        -2.5,
        -0.0,
        0.0,
        3.0,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e-310,
        -1e-40,
    ];
    for dtype in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        let x = t(&v, &[3, 3]).to_dtype(dtype).unwrap();
        let want = x.relu().unwrap();
        x.relu_().unwrap();
        assert_eq!(bits(&x), bits(&want), "{dtype}");
        assert_eq!(x.version(), 1, "{dtype}");
        // -0.0 becomes +0.0, as relu makes it.
        assert_eq!(bits(&x)[1], 0, "{dtype}");
        // Through a transposed view: every element of the base, once.
        let base = t(&v, &[3, 3]).to_dtype(dtype).unwrap();
        base.t().unwrap().relu_().unwrap();
        assert_eq!(bits(&base), bits(&want), "{dtype}, transposed");
    }
    // Long enough to be split into parallel chunks (each reads the one broadcast zero).
    let long: Vec<f64> = (0..300_001)
        .map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0)
        .collect();
    let x = t(&long, &[long.len()]);
    let want = x.relu().unwrap();
    x.relu_().unwrap();
    assert_eq!(bits(&x), bits(&want));
    // The dtypes relu refuses, refused by name.
    for dtype in [DType::Bool, DType::U8] {
        let x = Tensor::zeros(&[2], dtype, Device::Cpu).unwrap();
        let e = x.relu_().unwrap_err().to_string();
        assert!(e.contains("relu_") && e.contains("to_dtype"), "{e}");
        let e = x.into_relu().unwrap_err().to_string();
        assert!(e.starts_with("relu") && e.contains("to_dtype"), "{e}");
    }
    let i = Tensor::from_vec(vec![-3i64, 0, 5], &[3], Device::Cpu).unwrap();
    let want = i.relu().unwrap().to_vec::<i64>().unwrap();
    i.relu_().unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), want);
    assert_eq!(want, vec![0, 0, 5]);
}

#[test]
fn relu_in_place_refuses_under_grad_and_a_saved_input_notices() {
    let p = Parameter::new(t(&[-1., 2.], &[2])).unwrap();
    let e = p.relu_().unwrap_err().to_string();
    assert!(e.contains("relu_") && e.contains("no_grad"), "{e}");
    let x = t(&[-1., 1.], &[2]);
    let y = p.mul(&x).unwrap().sum_all().unwrap(); // MulBackward saved x
    x.relu_().unwrap();
    let e = y.backward().unwrap_err().to_string();
    assert!(e.contains("modified in place"), "{e}");
}

#[test]
fn owned_relu_and_add_reuse_a_buffer_only_when_no_one_else_sees_it() {
    let v = [-1., 2., -3., 4.];
    let relu = [0., 2., 0., 4.];
    no_grad(|| {
        // Alone: the result is the input's buffer.
        let x = t(&v, &[2, 2]);
        let key = x.storage_key();
        let y = x.into_relu().unwrap();
        assert_eq!(
            (y.storage_key(), y.to_vec::<f64>().unwrap()),
            (key, relu.to_vec())
        );
        // A kept handle, or a view of another tensor: a new buffer, the other unchanged.
        let x = t(&v, &[2, 2]);
        let kept = x.clone();
        let y = x.into_relu().unwrap();
        assert_ne!(y.storage_key(), kept.storage_key());
        assert_eq!(kept.to_vec::<f64>().unwrap(), v.to_vec());
        let base = t(&v, &[4]);
        let y = base.reshape(&[2, 2]).unwrap().into_relu().unwrap();
        assert_ne!(y.storage_key(), base.storage_key());
        assert_eq!(base.to_vec::<f64>().unwrap(), v.to_vec());
        assert_eq!(y.to_vec::<f64>().unwrap(), relu.to_vec());
        // The sum: in place for an operand of the same shape, a new tensor for a broadcast one.
        let x = t(&v, &[2, 2]);
        let key = x.storage_key();
        let s = x.into_add(&t(&[1., 1., 1., 1.], &[2, 2])).unwrap();
        assert_eq!(
            (s.storage_key(), s.to_vec::<f64>().unwrap()),
            (key, vec![0., 3., -2., 5.])
        );
        let row = t(&[10., 20.], &[1, 2]);
        let s = t(&v, &[1, 4])
            .reshape(&[2, 2])
            .unwrap()
            .into_add(&row)
            .unwrap();
        assert_eq!(s.to_vec::<f64>().unwrap(), vec![9., 22., 7., 24.]);
        Ok::<(), kiln_autograd::Error>(())
    })
    .unwrap();
    // Recording a graph: a result no one else holds is still reused (mul saved its inputs,
    // not its output; relu's node reads its output), and the sum after it is not (relu saved
    // that output); relu's and add's gradients either way.
    let p = Parameter::new(t(&v, &[4])).unwrap();
    let h = p.mul_scalar(1.0).unwrap();
    let key = h.storage_key();
    let r = h.into_relu().unwrap();
    assert_eq!(r.storage_key(), key);
    let y = r.into_add(&p).unwrap();
    assert_ne!(y.storage_key(), key);
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![-1., 4., -3., 8.]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        p.grad().unwrap().to_vec::<f64>().unwrap(),
        vec![1., 2., 1., 2.]
    );
    // A leaf that requires grad, and a tensor a node saved (exp keeps its output), are not.
    let leaf = t(&v, &[4]).set_requires_grad(true).unwrap();
    let key = leaf.storage_key();
    let y = leaf.into_relu().unwrap();
    assert_ne!(y.storage_key(), key);
    assert!(y.requires_grad());
    let q = Parameter::new(t(&[0.5, -0.5], &[2])).unwrap();
    let e = q.exp().unwrap();
    let key = e.storage_key();
    let y = e.into_relu().unwrap();
    assert_ne!(y.storage_key(), key);
    y.sum_all().unwrap().backward().unwrap();
    let want: Vec<f64> = [0.5f64, -0.5].iter().map(|x| x.exp()).collect();
    assert_eq!(q.grad().unwrap().to_vec::<f64>().unwrap(), want);
}
