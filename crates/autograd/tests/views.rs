//! View and stride semantics: which ops share storage, what strides they produce, and the values
//! seen through them. Runs on every device in `common::devices()`.

mod common;

use common::devices;
use kiln_autograd::{DType, Tensor};

fn iota(shape: &[usize], device: kiln_autograd::Device) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::arange(0.0, n as f64, 1.0, DType::F32, device)
        .unwrap()
        .reshape_to(shape)
        .unwrap()
}

#[test]
fn permute_transpose_narrow_select_are_views_with_pytorch_strides() {
    for dev in devices() {
        let x = iota(&[2, 3, 4], dev);
        assert_eq!(x.strides(), &[12, 4, 1]);
        let p = x.permute(&[2, 0, 1]).unwrap();
        assert_eq!((p.shape(), p.strides()), (&[4, 2, 3][..], &[1, 12, 4][..]));
        assert!(p.shares_storage_with(&x) && !p.is_contiguous());
        assert_eq!(
            p.select(0, 1).unwrap().to_vec::<f32>().unwrap(),
            vec![1., 5., 9., 13., 17., 21.]
        );
        let t = x.transpose(1, 2).unwrap();
        assert_eq!(t.strides(), &[12, 1, 4]);
        let n = x.narrow(2, 1, 2).unwrap();
        assert!(n.shares_storage_with(&x));
        assert_eq!(n.layout().offset(), 1);
        assert_eq!(
            n.select(0, 1).unwrap().to_vec::<f32>().unwrap(),
            vec![13., 14., 17., 18., 21., 22.]
        );
        let s = x.select(1, -1).unwrap();
        assert_eq!((s.shape(), s.layout().offset()), (&[2, 4][..], 8));
        assert_eq!(
            s.to_vec::<f32>().unwrap(),
            vec![8., 9., 10., 11., 20., 21., 22., 23.]
        );
    }
}

#[test]
fn view_needs_a_compatible_layout_and_reshape_copies_only_then() {
    for dev in devices() {
        let x = iota(&[2, 3, 4], dev);
        let v = x.view(&[6, -1]).unwrap();
        assert!(v.shares_storage_with(&x));
        assert_eq!(v.shape(), &[6, 4]);
        let p = x.permute(&[0, 2, 1]).unwrap();
        assert!(p.view(&[8, 3]).is_err());
        // Splitting a dim of a permuted tensor is still a view.
        assert!(p.view(&[2, 2, 2, 3]).unwrap().shares_storage_with(&x));
        let r = p.reshape(&[8, 3]).unwrap();
        assert!(!r.shares_storage_with(&x) && r.is_contiguous());
        assert_eq!(&r.to_vec::<f32>().unwrap()[..6], &[0., 4., 8., 1., 5., 9.]);
        let r2 = x.reshape(&[4, 6]).unwrap();
        assert!(r2.shares_storage_with(&x));
    }
}

#[test]
fn expand_has_zero_strides_and_contiguous_materialises() {
    for dev in devices() {
        let c = iota(&[3, 1], dev);
        let e = c.expand(&[2, 3, 4]).unwrap();
        assert_eq!(e.strides(), &[0, 1, 0]);
        assert!(e.shares_storage_with(&c));
        let m = e.contiguous().unwrap();
        assert!(!m.shares_storage_with(&c));
        assert_eq!(m.strides(), &[12, 4, 1]);
        assert_eq!(
            &m.to_vec::<f32>().unwrap()[..8],
            &[0., 0., 0., 0., 1., 1., 1., 1.]
        );
        let already = iota(&[2, 2], dev);
        assert!(already.contiguous().unwrap().shares_storage_with(&already));
    }
}

#[test]
fn squeeze_unsqueeze_flatten_shapes() {
    for dev in devices() {
        let x = iota(&[2, 1, 3, 1], dev);
        assert_eq!(x.squeeze().unwrap().shape(), &[2, 3]);
        assert_eq!(x.squeeze_dim(1).unwrap().shape(), &[2, 3, 1]);
        assert_eq!(x.squeeze_dim(0).unwrap().shape(), &[2, 1, 3, 1]);
        assert_eq!(x.unsqueeze(-1).unwrap().shape(), &[2, 1, 3, 1, 1]);
        assert_eq!(x.unsqueeze(0).unwrap().shape(), &[1, 2, 1, 3, 1]);
        assert_eq!(x.flatten(1, -1).unwrap().shape(), &[2, 3]);
        assert_eq!(x.flatten(0, -1).unwrap().shape(), &[6]);
    }
}

#[test]
fn chunk_split_cat_stack() {
    for dev in devices() {
        let x = iota(&[5, 2], dev);
        let parts = x.chunk(2, 0).unwrap();
        assert_eq!(
            parts.iter().map(|p| p.shape()[0]).collect::<Vec<_>>(),
            vec![3, 2]
        );
        assert!(parts.iter().all(|p| p.shares_storage_with(&x)));
        let pieces = x.split(2, 0).unwrap();
        assert_eq!(
            pieces.iter().map(|p| p.shape()[0]).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        let back = Tensor::cat(&pieces, 0).unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        let cols = x.split(1, 1).unwrap();
        let swapped = Tensor::cat(&[cols[1].clone(), cols[0].clone()], 1).unwrap();
        assert_eq!(&swapped.to_vec::<f32>().unwrap()[..4], &[1., 0., 3., 2.]);
        let a = iota(&[2, 2], dev);
        let s = Tensor::stack(&[a.clone(), a.add_scalar(10.0).unwrap()], 1).unwrap();
        assert_eq!(s.shape(), &[2, 2, 2]);
        assert_eq!(
            s.to_vec::<f32>().unwrap(),
            vec![0., 1., 10., 11., 2., 3., 12., 13.]
        );
    }
}

#[test]
fn ops_read_strided_inputs_correctly() {
    for dev in devices() {
        let x = iota(&[3, 4], dev);
        let t = x.t().unwrap();
        // elementwise on a transposed view, then broadcasting against a column
        let col = iota(&[4, 1], dev);
        let y = t.add(&col).unwrap();
        assert_eq!(&y.to_vec::<f32>().unwrap()[..6], &[0., 4., 8., 2., 6., 10.]);
        assert_eq!(
            t.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(),
            vec![12., 15., 18., 21.]
        );
        let m = t.matmul(&x).unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap()[0], 0. * 0. + 4. * 4. + 8. * 8.);
    }
}

#[test]
fn empty_tensors_flow_through_ops() {
    for dev in devices() {
        let e = Tensor::zeros(&[0, 3], DType::F32, dev).unwrap();
        assert_eq!(
            e.sum(&[0], false).unwrap().to_vec::<f32>().unwrap(),
            vec![0.0; 3]
        );
        assert_eq!(e.exp().unwrap().shape(), &[0, 3]);
        let one = Tensor::ones(&[1, 3], DType::F32, dev).unwrap();
        assert_eq!(Tensor::cat(&[e.clone(), one], 0).unwrap().shape(), &[1, 3]);
        let a = Tensor::zeros(&[2, 0], DType::F32, dev).unwrap();
        let b = Tensor::ones(&[0, 3], DType::F32, dev).unwrap();
        assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
        assert!(e.amax(&[0], false).is_err());
        assert_eq!(e.view(&[3, 0]).unwrap().shape(), &[3, 0]);
    }
}
