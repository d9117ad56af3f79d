//! Creation, conversion and random numbers.

mod common;

use common::devices;
use half::{bf16, f16};
use kiln_autograd::{manual_seed, DType, Device, Generator, Tensor};

#[test]
fn filled_and_ranged_tensors() {
    for dev in devices() {
        assert_eq!(
            Tensor::zeros(&[2, 2], DType::F32, dev)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
            vec![0.0; 4]
        );
        assert_eq!(
            Tensor::ones(&[3], DType::I64, dev)
                .unwrap()
                .to_vec::<i64>()
                .unwrap(),
            vec![1; 3]
        );
        assert_eq!(
            Tensor::full(&[2], 2.5, DType::F64, dev)
                .unwrap()
                .to_vec::<f64>()
                .unwrap(),
            vec![2.5; 2]
        );
        let a = Tensor::arange(0.0, 1.0, 0.25, DType::F32, dev).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![0.0, 0.25, 0.5, 0.75]);
        let d = Tensor::arange(5.0, 0.0, -2.0, DType::I64, dev).unwrap();
        assert_eq!(d.to_vec::<i64>().unwrap(), vec![5, 3, 1]);
        assert_eq!(
            Tensor::scalar(7.0, DType::F32, dev)
                .unwrap()
                .item()
                .unwrap(),
            7.0
        );
        assert_eq!(
            Tensor::scalar(7.0, DType::F32, dev).unwrap().shape(),
            &[] as &[usize]
        );
    }
}

#[test]
fn dtype_conversions_follow_pytorch() {
    let x = Tensor::from_slice(&[-1.7f32, 0.0, 2.9], &[3], Device::Cpu).unwrap();
    assert_eq!(
        x.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![-1, 0, 2]
    );
    let b = x.to_dtype(DType::Bool).unwrap();
    assert_eq!(b.to_vec_f64().unwrap(), vec![1.0, 0.0, 1.0]);
    let h = x.to_dtype(DType::F16).unwrap();
    assert_eq!(h.to_vec::<f16>().unwrap()[2], f16::from_f32(2.9));
    let bf = x.to_dtype(DType::BF16).unwrap();
    assert_eq!(bf.to_vec::<bf16>().unwrap()[0], bf16::from_f32(-1.7));
    // half-precision arithmetic rounds once per op
    let s = h.add(&h).unwrap();
    assert_eq!(s.dtype(), DType::F16);
    assert_eq!(
        s.to_vec::<f16>().unwrap()[2],
        f16::from_f32(f16::from_f32(2.9).to_f32() * 2.0)
    );
    let m = bf
        .reshape(&[1, 3])
        .unwrap()
        .matmul(&bf.reshape(&[3, 1]).unwrap())
        .unwrap();
    assert_eq!(m.dtype(), DType::BF16);
    let want: f32 = [-1.7f32, 0.0, 2.9]
        .iter()
        .map(|v| bf16::from_f32(*v).to_f32().powi(2))
        .sum();
    assert_eq!(m.to_vec::<bf16>().unwrap()[0], bf16::from_f32(want));
    let sm = h
        .softmax(0)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .sum_all()
        .unwrap()
        .item()
        .unwrap();
    assert!((sm - 1.0).abs() < 2e-3);
}

#[test]
fn integer_and_bool_reductions() {
    let i = Tensor::from_slice(&[3i64, -1, 4, 1, -5, 9], &[2, 3], Device::Cpu).unwrap();
    assert_eq!(
        i.sum(&[1], false).unwrap().to_vec::<i64>().unwrap(),
        vec![6, 5]
    );
    assert_eq!(
        i.amax(&[0], false).unwrap().to_vec::<i64>().unwrap(),
        vec![3, -1, 9]
    );
    assert_eq!(
        i.argmin(1, false).unwrap().to_vec::<i64>().unwrap(),
        vec![1, 1]
    );
    let mask = i.gt_scalar(0.0).unwrap();
    assert_eq!(mask.dtype(), DType::Bool);
    let count = mask.sum_all().unwrap();
    assert_eq!((count.dtype(), count.item().unwrap()), (DType::I64, 4.0));
}

#[test]
fn to_device_on_the_same_device_is_free() {
    let x = Tensor::ones(&[2], DType::F32, Device::Cpu).unwrap();
    assert!(x.to_device(Device::Cpu).unwrap().shares_storage_with(&x));
}

#[test]
fn philox_draws_are_reproducible_and_tied_to_the_counter() {
    let a = Generator::new(0)
        .uniform(&[8], 0.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    // Element 0 uses Philox4x32-10(counter 0, key 0), whose first word is 0x6627e8d5 (the
    // Random123 known-answer vector); 24 bits of it make the f32 uniform. CUDA must match this.
    assert_eq!(a[0], (0x6627_e8d5u32 >> 8) as f32 / (1u32 << 24) as f32);
    let b = Generator::new(0)
        .uniform(&[8], 0.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b);
    // A second draw continues the counter: the same numbers as one draw of twice the size.
    let mut g = Generator::new(5);
    let first = g
        .normal(&[4], 0.0, 1.0, DType::F64, Device::Cpu)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let second = g
        .normal(&[4], 0.0, 1.0, DType::F64, Device::Cpu)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let both = Generator::new(5)
        .normal(&[8], 0.0, 1.0, DType::F64, Device::Cpu)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert_eq!([first, second].concat(), both);
    // The default generator is reset by manual_seed.
    manual_seed(42);
    let r1 = Tensor::randn(&[3], DType::F32, Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    manual_seed(42);
    let r2 = Tensor::randn(&[3], DType::F32, Device::Cpu)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(r1, r2);
}

#[test]
fn distributions_have_the_right_moments() {
    let n = 200_000;
    let u = Generator::new(1)
        .uniform(&[n], -2.0, 2.0, DType::F64, Device::Cpu)
        .unwrap();
    let v = u.to_vec::<f64>().unwrap();
    assert!(v.iter().all(|&x| (-2.0..2.0).contains(&x)));
    assert!(u.mean_all().unwrap().item().unwrap().abs() < 0.02);
    let z = Generator::new(2)
        .normal(&[n], 3.0, 2.0, DType::F64, Device::Cpu)
        .unwrap();
    assert!((z.mean_all().unwrap().item().unwrap() - 3.0).abs() < 0.02);
    assert!((z.std(&[], 1, false).unwrap().item().unwrap() - 2.0).abs() < 0.02);
}
