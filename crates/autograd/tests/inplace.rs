//! In-place updates: they write through views, bump the version counter, refuse tensors that
//! require grad outside no_grad, and make a backward that saved the old values fail loudly.

use kiln_autograd::{no_grad, DType, Device, Parameter, Tensor};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
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
