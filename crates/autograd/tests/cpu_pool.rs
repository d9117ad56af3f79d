//! `on_cpu_pool`: a whole pass handed to kiln's CPU pool sees the caller's grad mode and
//! autocast dtype, and leaves the pool threads' own state as it found it. One test function in
//! a binary of its own: the pool is process-wide, and another test running a closure on it under
//! `no_grad` at the same time would change what a pool thread reports.

use kiln_autograd::{
    autocast_dtype, is_grad_enabled, no_grad, on_cpu_pool, AutocastGuard, DType, Device, Tensor,
};
use kiln_device::threads::cpu_pool;

/// Every pool thread's (grad mode, autocast dtype).
fn pool_state() -> Vec<(bool, Option<DType>)> {
    cpu_pool().broadcast(|_| (is_grad_enabled(), autocast_dtype()))
}

#[test]
fn the_callers_state_reaches_the_pool_and_the_pools_state_comes_back_after() {
    let fresh = vec![(true, None); kiln_device::threads::num_threads()];
    assert_eq!(pool_state(), fresh);
    // Runs on a pool thread, with the caller's grad mode.
    let on_pool = || cpu_pool().current_thread_index().is_some();
    assert!(!on_pool());
    assert!(
        !on_cpu_pool(Device::Cuda(0), on_pool),
        "another device's pass stays here"
    );
    assert_eq!(
        on_cpu_pool(Device::Cpu, || (on_pool(), is_grad_enabled())),
        (true, true)
    );
    assert!(!no_grad(|| on_cpu_pool(Device::Cpu, is_grad_enabled)));
    assert_eq!(pool_state(), fresh);

    // The autocast dtype, and autocast turned off inside a scope.
    {
        let _bf16 = AutocastGuard::new(DType::BF16).unwrap();
        assert_eq!(on_cpu_pool(Device::Cpu, autocast_dtype), Some(DType::BF16));
        let _off = AutocastGuard::disabled();
        assert_eq!(on_cpu_pool(Device::Cpu, autocast_dtype), None);
    }
    assert_eq!(pool_state(), fresh);

    // Ops inside record the graph or not as the caller's mode says; backward works through it.
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], &[3], Device::Cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let y = no_grad(|| on_cpu_pool(Device::Cpu, || x.mul(&x))).unwrap();
    assert!(!y.requires_grad());
    let y = on_cpu_pool(Device::Cpu, || x.mul(&x)).unwrap();
    assert!(y.requires_grad());
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [2.0, -4.0, 6.0]);

    // A panic reaches the caller, and the pool thread's mode is restored all the same.
    let caught =
        std::panic::catch_unwind(|| no_grad(|| on_cpu_pool(Device::Cpu, || panic!("inside"))));
    assert!(caught.is_err());
    assert!(is_grad_enabled());
    assert_eq!(pool_state(), fresh);

    // From a pool thread the closure runs in place.
    let (outer, inner) = cpu_pool().install(|| {
        let outer = cpu_pool().current_thread_index();
        (
            outer,
            on_cpu_pool(Device::Cpu, || cpu_pool().current_thread_index()),
        )
    });
    assert!(outer.is_some());
    assert_eq!(outer, inner);

    // While ranks on threads hold passes off the pool, the closure runs on the caller.
    let held = kiln_device::threads::OpByOp::hold();
    assert!(!kiln_device::threads::passes_may_run_on_pool());
    assert!(!on_cpu_pool(Device::Cpu, on_pool));
    drop(held);
    assert!(on_cpu_pool(Device::Cpu, on_pool));
}
