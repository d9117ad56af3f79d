//! One test per bad-input class: each error names the op, the offending values and the fix.

use kiln_autograd::{BatchNormOptions, DType, Device, Error, Tensor};

fn zeros(shape: &[usize]) -> Tensor {
    Tensor::zeros(shape, DType::F32, Device::Cpu).unwrap()
}

fn msg<T: std::fmt::Debug>(r: kiln_autograd::Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn matmul_inner_dims() {
    let e = msg(zeros(&[32, 784]).matmul(&zeros(&[512, 256])));
    assert_eq!(e, "matmul: [32, 784] @ [512, 256]: inner dims 784 != 512");
    let e = msg(zeros(&[2, 3, 4]).matmul(&zeros(&[5, 4, 6])));
    assert!(
        e.contains("batch dims [2] and [5] cannot be broadcast"),
        "{e}"
    );
    assert!(msg(zeros(&[]).matmul(&zeros(&[3]))).contains("at least 1 dim"));
}

#[test]
fn broadcast_mismatch() {
    let e = msg(zeros(&[2, 3]).add(&zeros(&[4])));
    assert_eq!(e, "add: shapes [2, 3] and [4] cannot be broadcast: at dim -1 sizes 3 and 4 differ (each pair must be equal or one of them 1)");
    assert!(matches!(
        zeros(&[2, 3]).mul(&zeros(&[3, 2])),
        Err(Error::Shape { op: "mul", .. })
    ));
}

#[test]
fn dtype_mismatch_and_float_only_ops() {
    let a = zeros(&[2]);
    let b = Tensor::zeros(&[2], DType::F64, Device::Cpu).unwrap();
    let e = msg(a.add(&b));
    assert!(
        e.starts_with("add: dtypes differ (float32 vs float64)") && e.contains("to_dtype"),
        "{e}"
    );
    let i = Tensor::zeros(&[2], DType::I64, Device::Cpu).unwrap();
    let e = msg(i.exp());
    assert_eq!(
        e,
        "exp: dtype int64 is not supported; convert with to_dtype(DType::F32) first"
    );
    assert!(msg(i.matmul(&i)).contains("floating-point"));
    assert!(msg(i.set_requires_grad(true))
        .contains("only floating-point tensors can require gradients"));
    assert!(msg(a.to_vec::<f64>()).contains("to_dtype"));
}

#[test]
fn view_after_permute_names_the_fixes() {
    let e = msg(zeros(&[2, 3, 4]).permute(&[0, 2, 1]).unwrap().view(&[8, 3]));
    assert!(
        e.starts_with(
            "view: a tensor of shape [2, 4, 3] with strides [12, 1, 4] cannot be viewed as [8, 3]"
        ),
        "{e}"
    );
    assert!(e.contains("reshape") && e.contains("contiguous()"), "{e}");
    let e = msg(zeros(&[2, 3]).view(&[4, 2]));
    assert!(
        e.contains("[4, 2] has 8 elements but the tensor of shape [2, 3] has 6"),
        "{e}"
    );
    assert!(msg(zeros(&[2, 3]).view(&[-1, -1])).contains("only one dim can be -1"));
}

#[test]
fn dims_and_indices_out_of_range() {
    let x = zeros(&[2, 3]);
    assert_eq!(
        msg(x.sum(&[2], false)),
        "sum: dim 2 is out of range for a tensor of rank 2 (valid: -2..=1)"
    );
    assert!(msg(x.transpose(0, -3)).contains("out of range"));
    assert!(msg(x.narrow(1, 2, 2)).contains("start 2 + length 2 exceeds size 3 of dim 1"));
    assert!(msg(x.select(0, 2)).contains("index 2 is out of range for dim 0 of size 2"));
    assert!(msg(x.permute(&[0])).contains("give each dim exactly once"));
    assert!(msg(x.permute(&[1, 1])).contains("repeats"));
    assert!(msg(x.sum(&[1, -1], false)).contains("more than once"));
    assert!(msg(x.expand(&[3, 3])).contains("cannot expand shape [2, 3] to [3, 3]"));
    assert!(msg(x.chunk(0, 0)).contains("at least 1"));
}

#[test]
fn tensors_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tensor>();
    check::<kiln_autograd::Parameter>();
}

#[test]
fn creation_and_extraction() {
    let e = msg(Tensor::from_vec(vec![1.0f32; 5], &[2, 3], Device::Cpu));
    assert_eq!(e, "from_vec: 5 elements cannot fill shape [2, 3] (needs 6)");
    assert!(msg(zeros(&[2]).item()).contains("only one-element tensors"));
    assert!(msg(Tensor::arange(0.0, 5.0, -1.0, DType::F32, Device::Cpu)).contains("other sign"));
    assert!(msg(Tensor::arange(0.0, 5.0, 0.0, DType::F32, Device::Cpu)).contains("step nonzero"));
    // A CUDA device on a machine (or build) without CUDA is an error, never a panic; where the
    // driver reports a usable device (a GPU, or the CUDA emulator), the tensor is made.
    let on_cuda = Tensor::zeros(&[2], DType::F32, Device::Cuda(0));
    assert_eq!(
        on_cuda.is_ok(),
        kiln_device::cuda_status().is_available(),
        "{on_cuda:?}"
    );
}

#[test]
fn cat_and_stack_shapes() {
    let e = msg(Tensor::cat(&[zeros(&[2, 3]), zeros(&[2, 4])], 0));
    assert!(
        e.contains(
            "tensor 1 has shape [2, 4] but tensor 0 has [2, 3]: all dims except dim 0 must match"
        ),
        "{e}"
    );
    assert!(msg(Tensor::stack(&[zeros(&[2]), zeros(&[3])], 0)).contains("stack needs equal shapes"));
    assert!(msg(Tensor::cat(&[], 0)).contains("at least one tensor"));
}

#[test]
fn autograd_misuse() {
    let x = zeros(&[3]);
    let e = msg(x.sum_all().unwrap().backward());
    assert!(
        e.contains("does not require grad") && e.contains("set_requires_grad(true)"),
        "{e}"
    );
    x.set_requires_grad(true).unwrap();
    let y = x.exp().unwrap();
    let e = msg(y.backward());
    assert!(
        e.contains("only for scalar outputs") && e.contains("[3]") && e.contains("backward_with"),
        "{e}"
    );
    let e = msg(y.backward_with(Some(&zeros(&[2])), false));
    assert!(
        e.contains("gradient shape [2] does not match the tensor's shape [3]"),
        "{e}"
    );
    let e = msg(y.set_requires_grad(false));
    assert!(
        e.contains("only leaf tensors") && e.contains("detach()"),
        "{e}"
    );
    let s = y.sum_all().unwrap();
    s.backward().unwrap();
    let e = msg(s.backward());
    assert!(
        e.contains("a second time") && e.contains("retain_graph"),
        "{e}"
    );
}

#[test]
fn masks_must_be_bool_and_fit() {
    let x = zeros(&[2, 3]);
    assert!(msg(x.masked_fill(&zeros(&[2, 3]), 1.0)).contains("needs a bool tensor"));
    let wrong = Tensor::zeros(&[3, 2], DType::Bool, Device::Cpu).unwrap();
    let e = msg(x.masked_fill(&wrong, 1.0));
    assert!(
        e.starts_with("masked_fill") && e.contains("shapes [2, 3] and [3, 2] cannot be broadcast"),
        "{e}"
    );
    assert!(msg(zeros(&[3]).triu(0)).contains("at least 2 dims"));
    assert!(msg(x.norm(0.0, &[], false)).contains("p must be positive"));
}

/// A hostile float setting is echoed as `-1e300`, not as 301 digits (Display's form).
#[test]
fn float_settings_are_echoed_in_short_form() {
    let x = zeros(&[2, 3]);
    let options = BatchNormOptions {
        eps: -1e300,
        ..BatchNormOptions::default()
    };
    for e in [
        msg(x.dropout(-1e300, true)),
        msg(x.norm(-1e300, &[], false)),
        msg(x.layer_norm(&[3], None, None, -1e300)),
        msg(x.batch_norm(None, None, None, None, options)),
    ] {
        assert!(e.contains("-1e300") && e.len() < 300, "{e}");
    }
}
