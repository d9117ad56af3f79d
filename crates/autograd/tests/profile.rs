//! `OpProfile`: the forward ops and backward nodes a step runs, counted exactly, with the
//! engine's own sums; nested ops by self time. Its own test binary: the profile is
//! process-wide, and no other test's ops may run while it records.

use kiln_autograd::{autocast, DType, Device, NodeTime, OpProfile, Tensor};
use std::sync::Mutex;
use std::time::Instant;

/// The tests of this file take turns: one profile records at a time.
static TURN: Mutex<()> = Mutex::new(());

fn leaf(shape: &[usize]) -> Tensor {
    let t = Tensor::randn(shape, DType::F32, Device::Cpu).unwrap();
    t.set_requires_grad(true).unwrap();
    t
}

fn calls(times: &[NodeTime], name: &str) -> u64 {
    times.iter().find(|t| t.name == name).map_or(0, |t| t.calls)
}

fn slowest_first(times: &[NodeTime]) -> bool {
    times.iter().all(|t| t.seconds >= 0.0) && times.windows(2).all(|p| p[0].seconds >= p[1].seconds)
}

#[test]
fn a_profile_counts_every_op_node_and_sum_of_one_step() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let (x, w) = (leaf(&[2, 3]), leaf(&[3, 4]));
    // `x` feeds two products, whose gradients for it meet in one sum; `w` feeds both too.
    let build = || {
        let a = x.matmul(&w).unwrap();
        let b = x.matmul(&w).unwrap();
        a.mul(&b).unwrap().sum(&[], false).unwrap()
    };
    // Nothing is recorded outside a profile.
    build().backward().unwrap();
    let profile = OpProfile::start().unwrap();
    // One at a time.
    let second = OpProfile::start().unwrap_err().to_string();
    assert!(second.contains("already recording"), "{second}");
    let started = Instant::now();
    build().backward().unwrap();
    let wall = started.elapsed().as_secs_f64();
    let times = profile.finish();
    let back = &times.backward;
    assert_eq!(calls(back, "SumBackward"), 1);
    assert_eq!(calls(back, "MulBackward"), 1);
    assert_eq!(calls(back, "MmBackward"), 2);
    // Two leaves, each reached along two paths: one sum and one accumulation each.
    assert_eq!(calls(back, OpProfile::GRADIENT_SUM), 2);
    assert_eq!(calls(back, OpProfile::ACCUMULATE_GRAD), 2);
    assert_eq!(back.len(), 5, "{back:?}");
    // The forward ops, and only those: the products, sums and transposes the backward nodes
    // run inside them are theirs.
    let fwd = &times.forward;
    assert_eq!(calls(fwd, "Mm"), 2);
    assert_eq!(calls(fwd, "Mul"), 1);
    assert_eq!(calls(fwd, "Sum"), 1);
    assert_eq!(fwd.len(), 3, "{fwd:?}");
    assert!(slowest_first(fwd) && slowest_first(back));
    let total: f64 = fwd.iter().chain(back).map(|t| t.seconds).sum();
    assert!(total <= wall, "{total} s recorded in {wall} s");
    // Finished, it records nothing more, and a new profile starts empty.
    build().backward().unwrap();
    let empty = OpProfile::start().unwrap();
    assert_eq!(empty.finish(), Default::default());
    // A dropped profile stops recording too.
    drop(OpProfile::start().unwrap());
    // A device that cannot be waited for is refused by name, and nothing records.
    if let Some(reason) = kiln_device::cuda_status().reason() {
        let e = OpProfile::start_synchronized(Device::Cuda(0))
            .unwrap_err()
            .to_string();
        assert!(e.to_lowercase().contains("cuda"), "{e} ({reason})");
    }
    let e = OpProfile::start_synchronized(Device::Cuda(4096))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("4096") || e.to_lowercase().contains("cuda"),
        "{e}"
    );
    drop(OpProfile::start().unwrap());
    // Waiting on the CPU changes nothing but the name.
    let profile = OpProfile::start_synchronized(Device::Cpu).unwrap();
    build().backward().unwrap();
    let again = profile.finish();
    let names = |t: &[NodeTime]| {
        let mut n: Vec<_> = t.iter().map(|t| (t.name, t.calls)).collect();
        n.sort();
        n
    };
    assert_eq!(names(&again.forward), names(fwd));
    assert_eq!(names(&again.backward), names(back));
}

#[test]
fn nested_ops_keep_their_own_time_and_an_op_run_again_counts_once() {
    // Autocast casts both operands (two `ToDtype` ops inside the product), then runs the
    // product again on the casts: one `Mm`, two casts, each by its own time.
    let (a, b) = (leaf(&[64, 64]), leaf(&[64, 64]));
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let profile = OpProfile::start().unwrap();
    let started = Instant::now();
    let y = autocast(DType::BF16, || a.matmul(&b)).unwrap().unwrap();
    let wall = started.elapsed().as_secs_f64();
    let times = profile.finish();
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(calls(&times.forward, "Mm"), 1, "{:?}", times.forward);
    assert_eq!(calls(&times.forward, "ToDtype"), 2, "{:?}", times.forward);
    assert_eq!(times.forward.len(), 2, "{:?}", times.forward);
    assert!(times.backward.is_empty());
    // Self times: together no more than the wall time of the outer op.
    let total: f64 = times.forward.iter().map(|t| t.seconds).sum();
    assert!(total <= wall, "{total} s recorded in {wall} s");
}

#[test]
fn an_op_begun_under_one_profile_is_not_counted_in_the_next() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    // A leaf's accumulation begins under the first profile; its hook ends that profile and
    // starts the second, which must not receive the accumulation's time.
    static SLOTS: Mutex<(Option<OpProfile>, Option<OpProfile>)> = Mutex::new((None, None));
    let x = leaf(&[3]);
    let _hook = x
        .register_post_accumulate_grad_hook(|_| {
            let mut slots = SLOTS.lock().unwrap();
            drop(slots.0.take());
            slots.1 = Some(OpProfile::start().unwrap());
            Ok(())
        })
        .unwrap();
    SLOTS.lock().unwrap().0 = Some(OpProfile::start().unwrap());
    x.mul(&x)
        .unwrap()
        .sum(&[], false)
        .unwrap()
        .backward()
        .unwrap();
    let second = SLOTS.lock().unwrap().1.take().expect("the hook ran");
    let times = second.finish();
    assert_eq!(
        calls(&times.backward, OpProfile::ACCUMULATE_GRAD),
        0,
        "{times:?}"
    );
    assert!(times.forward.is_empty(), "{times:?}");
}
