//! `BackwardProfile`: the nodes a backward runs, counted exactly, and the engine's own sums.
//! Its own test binary: the profile is process-wide, and no other test's backward may run while
//! it records.

use kiln_autograd::{BackwardProfile, DType, Device, Tensor};

fn leaf(shape: &[usize]) -> Tensor {
    let t = Tensor::randn(shape, DType::F32, Device::Cpu).unwrap();
    t.set_requires_grad(true).unwrap();
    t
}

#[test]
fn a_profile_counts_every_node_and_sum_of_one_backward() {
    let (x, w) = (leaf(&[2, 3]), leaf(&[3, 4]));
    // `x` feeds two products, whose gradients for it meet in one sum; `w` feeds both too.
    let build = || {
        let a = x.matmul(&w).unwrap();
        let b = x.matmul(&w).unwrap();
        a.mul(&b).unwrap().sum(&[], false).unwrap()
    };
    // Nothing is recorded outside a profile.
    build().backward().unwrap();
    let profile = BackwardProfile::start().unwrap();
    // One at a time.
    let second = BackwardProfile::start().unwrap_err().to_string();
    assert!(second.contains("already recording"), "{second}");
    build().backward().unwrap();
    let times = profile.finish();
    let calls = |name: &str| times.iter().find(|t| t.name == name).map_or(0, |t| t.calls);
    assert_eq!(calls("SumBackward"), 1);
    assert_eq!(calls("MulBackward"), 1);
    assert_eq!(calls("MmBackward"), 2);
    // Two leaves, each reached along two paths: one sum and one accumulation each.
    assert_eq!(calls(BackwardProfile::GRADIENT_SUM), 2);
    assert_eq!(calls(BackwardProfile::ACCUMULATE_GRAD), 2);
    assert_eq!(times.len(), 5, "{times:?}");
    assert!(times.iter().all(|t| t.seconds >= 0.0));
    assert!(times.windows(2).all(|p| p[0].seconds >= p[1].seconds));
    // Finished, it records nothing more, and a new profile starts empty.
    build().backward().unwrap();
    let empty = BackwardProfile::start().unwrap();
    assert_eq!(empty.finish(), Vec::new());
    // A dropped profile stops recording too.
    drop(BackwardProfile::start().unwrap());
    assert!(BackwardProfile::start().is_ok());
}
