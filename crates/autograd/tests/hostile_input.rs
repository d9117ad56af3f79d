//! Issue 18 regressions: hostile sizes and dims through the public API give typed errors (never a
//! wrapped size, panic or abort), and 0-d tensors take dims as PyTorch does.

use kiln_autograd::{DType, Device, Error, Generator, Tensor};

#[test]
fn shape_products_that_wrap_are_refused() {
    let huge = [1usize << 32, 1 << 32];
    let e = Tensor::zeros(&huge, DType::F32, Device::Cpu).expect_err("2^64 elements");
    assert!(matches!(e, Error::Shape { op: "full", .. }), "{e}");
    assert!(e.to_string().contains("[4294967296, 4294967296]"), "{e}");

    let e = Tensor::from_vec(vec![1.0f32, 2.0], &[(1 << 63) + 1, 2], Device::Cpu)
        .expect_err("2 values cannot fill [2^63+1, 2]");
    assert!(matches!(e, Error::Shape { op: "from_vec", .. }), "{e}");

    // A zero dim does not hide strides that overflow.
    let e = Tensor::zeros(&[0, 1 << 62, 1 << 62], DType::F32, Device::Cpu).unwrap_err();
    assert!(matches!(e, Error::Shape { op: "full", .. }), "{e}");

    assert!(Tensor::rand(&huge, DType::F32, Device::Cpu).is_err());
    assert!(Generator::new(0)
        .normal(&huge, 0.0, 1.0, DType::F32, Device::Cpu)
        .is_err());

    let t = Tensor::zeros(&[0], DType::F32, Device::Cpu).unwrap();
    assert!(matches!(
        t.reshape(&[1 << 32, 1 << 32, 0]),
        Err(Error::Shape { op: "reshape", .. })
    ));
    assert!(matches!(
        t.reshape_to(&[1 << 32, 1 << 32, 0]),
        Err(Error::Shape { op: "reshape", .. })
    ));
    let one = Tensor::zeros(&[1], DType::F32, Device::Cpu).unwrap();
    assert!(matches!(
        one.expand(&[1 << 32, 1 << 32]),
        Err(Error::Shape { op: "expand", .. })
    ));
    // Ordinary shapes still work, zero dims included.
    assert_eq!(t.reshape(&[0, 3]).unwrap().shape(), &[0, 3]);
    assert_eq!(t.reshape(&[-1, 3]).unwrap().shape(), &[0, 3]);
}

#[test]
fn zero_d_tensors_take_dim_0_and_minus_1() {
    let x = Tensor::scalar(2.5, DType::F32, Device::Cpu).unwrap();
    for dim in [0isize, -1] {
        let s = x.softmax(dim).unwrap();
        assert_eq!(s.shape(), &[] as &[usize]);
        assert_eq!(s.item().unwrap(), 1.0);
        let l = x.log_softmax(dim).unwrap();
        assert_eq!(l.shape(), &[] as &[usize]);
        assert_eq!(l.item().unwrap(), 0.0);
        for keepdim in [false, true] {
            let s = x.sum(&[dim], keepdim).unwrap();
            assert_eq!(s.shape(), &[] as &[usize]);
            assert_eq!(s.item().unwrap(), 2.5);
            let m = x.mean(&[dim], keepdim).unwrap();
            assert_eq!(m.shape(), &[] as &[usize]);
            assert_eq!(m.item().unwrap(), 2.5);
        }
        let q = x.squeeze_dim(dim).unwrap();
        assert_eq!(q.shape(), &[] as &[usize]);
        assert_eq!(q.item().unwrap(), 2.5);
        for other in [0isize, -1] {
            let t = x.transpose(dim, other).unwrap();
            assert_eq!(t.shape(), &[] as &[usize]);
            assert_eq!(t.item().unwrap(), 2.5);
        }
    }
    for dim in [1isize, -2] {
        let e = x.softmax(dim).unwrap_err().to_string();
        assert!(e.contains("valid: -1..=0"), "{e}");
        assert!(x.sum(&[dim], false).is_err());
        assert!(x.squeeze_dim(dim).is_err());
        assert!(x.transpose(dim, 0).is_err());
    }
}

#[test]
fn a_cpu_tensor_larger_than_the_machine_says_so() {
    // About 3.6 TiB of f32 in one request: more than any test machine has. The report says one
    // request is larger than the memory there is and the system refused it, and gives no advice
    // the CPU cannot take (expandable segments) or that cannot help (a smaller batch).
    let elems = 990_000_000_000usize;
    let e = Tensor::zeros(&[elems], DType::F32, Device::Cpu).expect_err("3.6 TiB");
    let text = e.to_string();
    assert!(
        text.contains("out of memory: tried to allocate 3.60 TiB"),
        "{text}"
    );
    assert!(
        text.contains("this one request is larger than all the memory the host backend has"),
        "{text}"
    );
    assert!(
        text.contains("the system refused 3960000000000 bytes"),
        "{text}"
    );
    for wrong in ["expandable", "reduce the batch size"] {
        assert!(!text.contains(wrong), "`{wrong}` in:\n{text}");
    }
}

#[test]
fn max_and_min_of_an_empty_tensor_follow_pytorch() {
    // Reducing non-empty dims of an empty tensor gives an empty result (PyTorch: amax of
    // [0, 4, 2] over dim 2 is [0, 4]); reducing a dim of size 0 is refused, naming it.
    let t = Tensor::zeros(&[0, 4, 2], DType::F32, Device::Cpu).unwrap();
    assert_eq!(t.amax(&[2], false).unwrap().shape(), &[0, 4]);
    assert_eq!(t.amin(&[-1], true).unwrap().shape(), &[0, 4, 1]);
    let (values, indices) = t.max_dim(1, false).unwrap();
    assert_eq!(
        (values.shape(), indices.shape()),
        (&[0, 2][..], &[0, 2][..])
    );
    let e = t.amax(&[0], false).unwrap_err().to_string();
    assert!(
        e.contains("cannot reduce dim 0 of shape [0, 4, 2]: it has size 0"),
        "{e}"
    );
    assert!(t.max_all().is_err() && t.argmax(0, false).is_err());
}

#[test]
fn a_matmul_of_empty_operands_with_a_huge_output_is_refused() {
    // Both operands hold no elements, but the output would hold 2^64.
    let a = Tensor::zeros(&[1 << 32, 0], DType::F32, Device::Cpu).unwrap();
    let b = Tensor::zeros(&[0, 1 << 32], DType::F32, Device::Cpu).unwrap();
    let e = a.matmul(&b).unwrap_err().to_string();
    assert!(e.contains("matmul: the output's element count"), "{e}");
    assert!(e.contains("overflows"), "{e}");
    // A small empty product is zeros, as in PyTorch.
    let a = Tensor::zeros(&[2, 0], DType::F32, Device::Cpu).unwrap();
    let b = Tensor::zeros(&[0, 3], DType::F32, Device::Cpu).unwrap();
    assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
}

/// Convolutions with an empty dimension (no input channels, no output channels, no images; a
/// small plane and a wide one, which take different CPU paths) run forward and backward as
/// PyTorch does: the output is the bias (or empty), the gradients zeros of their shapes. They
/// used to panic inside the CPU kernels.
#[test]
fn convolutions_with_an_empty_dimension_run_forward_and_backward() {
    let cases: [([usize; 4], [usize; 4]); 5] = [
        ([2, 0, 8, 8], [4, 0, 3, 3]),
        ([2, 0, 20, 20], [8, 0, 3, 3]),
        ([2, 3, 8, 8], [0, 3, 3, 3]),
        ([2, 3, 20, 20], [0, 3, 3, 3]),
        ([0, 3, 8, 8], [4, 3, 3, 3]),
    ];
    let params = kiln_autograd::Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    for (xs, ws) in cases {
        let what = format!("input {xs:?}, weight {ws:?}");
        let x = Tensor::ones(&xs, DType::F32, Device::Cpu)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let w = Tensor::ones(&ws, DType::F32, Device::Cpu)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let bias: Vec<f32> = (0..ws[0]).map(|o| o as f32 + 0.5).collect();
        let b = Tensor::from_vec(bias.clone(), &[ws[0]], Device::Cpu)
            .unwrap()
            .set_requires_grad(true)
            .unwrap();
        let y = x.conv2d(&w, Some(&b), params).expect(&what);
        assert_eq!(y.shape(), &[xs[0], ws[0], xs[2], xs[3]], "{what}");
        let values = y.to_vec::<f32>().unwrap();
        let plane = xs[2] * xs[3];
        for (i, v) in values.iter().enumerate() {
            // With no input channels, every output is its channel's bias.
            if xs[1] == 0 {
                assert_eq!(*v, bias[i / plane % ws[0]], "{what}: element {i}");
            }
        }
        y.sum_all().unwrap().backward().expect(&what);
        // Nothing reaches the input without output channels, nor the weight without images or
        // input channels.
        for (t, shape, zero) in [(&x, &xs[..], ws[0] == 0), (&w, &ws[..], xs[0] * xs[1] == 0)] {
            let g = t.grad().expect("a gradient");
            assert_eq!(g.shape(), shape, "{what}");
            if zero {
                let g = g.to_vec::<f32>().unwrap();
                assert!(g.iter().all(|&v| v == 0.0), "{what}: {shape:?} gradient");
            }
        }
    }
}

/// A max-pooling window of 40001 x 40001 taps over a one-pixel image is valid (padding at most
/// half the kernel, as PyTorch requires): forward and backward read that pixel only, at once,
/// instead of building a padded plane of 1.6e9 elements.
#[test]
fn a_huge_pooling_window_over_one_pixel_runs_forward_and_backward() {
    let x = Tensor::from_vec(vec![2.5f32, -1.0], &[1, 2, 1, 1], Device::Cpu)
        .unwrap()
        .set_requires_grad(true)
        .unwrap();
    let params = kiln_autograd::MaxPool2dParams {
        kernel_size: [40001, 40001],
        stride: [1, 1],
        padding: [20000, 20000],
        dilation: [1, 1],
        ceil_mode: false,
    };
    let y = x.max_pool2d(params).unwrap();
    assert_eq!(y.shape(), &[1, 2, 1, 1]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.5, -1.0]);
    y.sum(&[], false).unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
}

/// The gradient of `sum_all` over an empty tensor is an expanded (stride-0) view of no elements;
/// backward rules that write into their incoming gradient must take it, since it shares no
/// written place. Before, `exp(t) * (t - x)` over `[4, 4, 0]` refused it as "an expanded view".
#[test]
fn backward_through_empty_tensors_takes_their_expanded_gradients() {
    for shape in [[4usize, 4, 0], [3, 0, 3]] {
        let x = Tensor::zeros(&shape, DType::F64, Device::Cpu).unwrap();
        x.set_requires_grad(true).unwrap();
        let t = Tensor::zeros(&shape, DType::F64, Device::Cpu).unwrap();
        t.set_requires_grad(true).unwrap();
        let loss = t.exp().unwrap().mul(&t.sub(&x).unwrap()).unwrap();
        loss.sum_all().unwrap().backward().unwrap();
        assert_eq!(x.grad().unwrap().shape(), &shape);
        assert_eq!(t.grad().unwrap().shape(), &shape);
    }
}
