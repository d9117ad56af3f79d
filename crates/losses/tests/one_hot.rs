//! `one_hot` values against PyTorch's rules (exact integers).

use kiln_autograd::{DType, Device, Tensor};
use kiln_losses::one_hot;

#[test]
fn one_hot_matches_pytorch() {
    let labels = Tensor::from_slice(&[2i64, 0, 1, 2], &[2, 2], Device::Cpu).unwrap();
    let out = one_hot(&labels, Some(4)).unwrap();
    assert_eq!(out.shape(), &[2, 2, 4]);
    assert_eq!(out.dtype(), DType::I64);
    assert_eq!(
        out.to_vec::<i64>().unwrap(),
        vec![0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0]
    );
    // None (PyTorch's -1) infers max + 1 classes.
    let inferred = one_hot(&labels, None).unwrap();
    assert_eq!(inferred.shape(), &[2, 2, 3]);
    assert_eq!(
        inferred.to_vec::<i64>().unwrap(),
        vec![0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    );
    // 0-d labels, uint8 labels, and empty labels with explicit classes.
    let scalar = one_hot(
        &Tensor::from_slice(&[1i64], &[], Device::Cpu).unwrap(),
        Some(3),
    )
    .unwrap();
    assert_eq!(
        (scalar.shape().to_vec(), scalar.to_vec::<i64>().unwrap()),
        (vec![3], vec![0, 1, 0])
    );
    let u8s = one_hot(
        &Tensor::from_slice(&[1u8, 0], &[2], Device::Cpu).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(u8s.to_vec::<i64>().unwrap(), vec![0, 1, 1, 0]);
    let empty = one_hot(
        &Tensor::from_slice::<i64>(&[], &[0], Device::Cpu).unwrap(),
        Some(5),
    )
    .unwrap();
    assert_eq!(empty.shape(), &[0, 5]);
}

#[test]
fn one_hot_then_mse_is_the_conversion_the_errors_suggest() {
    let labels = Tensor::from_slice(&[1i64, 0], &[2], Device::Cpu).unwrap();
    let target = one_hot(&labels, Some(2))
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let input = Tensor::from_slice(&[0.0f32, 1.0, 1.0, 0.5], &[2, 2], Device::Cpu).unwrap();
    let loss = kiln_losses::mse_loss(&input, &target, kiln_losses::Reduction::Sum).unwrap();
    assert_eq!(loss.item().unwrap(), 0.25);
}

/// Issue 18: class counts whose output cannot exist are typed errors, never a capacity-overflow
/// panic, a wrapped size or an allocation abort.
#[test]
fn huge_class_counts_are_errors() {
    let labels = Tensor::from_vec(vec![0i64], &[1], Device::Cpu).unwrap();
    // 8 TiB of int64: the allocator refuses it against the machine's memory.
    let e = one_hot(&labels, Some(1 << 40)).expect_err("larger than memory");
    assert!(e.to_string().contains("out of memory"), "{e}");
    // Outputs that cannot even be addressed are refused before allocating.
    for classes in [1usize << 63, 1 << 61, usize::MAX] {
        let e = one_hot(&labels, Some(classes)).expect_err("no such output fits");
        assert!(e.to_string().starts_with("one_hot: num_classes"), "{e}");
        assert!(
            e.to_string()
                .contains("too many int64 elements to address; pass the real"),
            "{e}"
        );
    }
    let top = Tensor::from_vec(vec![i64::MAX], &[1], Device::Cpu).unwrap();
    let e = one_hot(&top, None).expect_err("i64::MAX + 1 classes");
    assert!(e.to_string().starts_with("one_hot: num_classes"), "{e}");
    assert!(one_hot(&top, Some(usize::MAX)).is_err());
}
