//! `OpProfile::start_synchronized` on `cuda:0` (skips without a usable device; fails instead
//! under `KILN_REQUIRE_CUDA=1`): a small convolutional step's ops and nodes are counted exactly
//! while every one is waited for, under autocast too, and the waits leave a bad index for the
//! program's own `synchronize` to report. Its own test binary: the profile is process-wide.

use kiln::autograd::{autocast, DType, NodeTime, OpProfile, Tensor};
use kiln::device::testing::cuda_device_or_skip;

fn calls(times: &[NodeTime], name: &str) -> u64 {
    times.iter().find(|t| t.name == name).map_or(0, |t| t.calls)
}

#[test]
fn a_synchronized_profile_counts_a_cuda_steps_ops_and_nodes() {
    let Some(cuda) = cuda_device_or_skip() else {
        return;
    };
    let x = Tensor::randn(&[2, 3, 8, 8], DType::F32, cuda).unwrap();
    let w = Tensor::randn(&[4, 3, 3, 3], DType::F32, cuda).unwrap();
    w.set_requires_grad(true).unwrap();
    let step = |amp: bool| {
        let forward = || {
            x.conv2d(&w, None, Default::default())?
                .relu()?
                .sum(&[], false)
        };
        let loss = if amp {
            autocast(DType::BF16, forward).unwrap().unwrap()
        } else {
            forward().unwrap()
        };
        loss.backward().unwrap();
        w.set_grad(None).unwrap();
    };
    step(false);
    for amp in [false, true] {
        let profile = OpProfile::start_synchronized(cuda).unwrap();
        step(amp);
        let times = profile.finish();
        let (fwd, back) = (&times.forward, &times.backward);
        assert_eq!(calls(fwd, "Convolution"), 1, "amp {amp}: {fwd:?}");
        assert_eq!(calls(fwd, "Relu"), 1, "amp {amp}: {fwd:?}");
        assert_eq!(calls(fwd, "Sum"), 1, "amp {amp}: {fwd:?}");
        // Under autocast the input and the weight are cast to bf16 inside the convolution, and
        // the sum's operand back to f32 inside the sum.
        assert_eq!(calls(fwd, "ToDtype"), if amp { 3 } else { 0 }, "{fwd:?}");
        assert_eq!(calls(back, "ConvolutionBackward"), 1, "amp {amp}: {back:?}");
        assert_eq!(calls(back, "ReluBackward"), 1, "amp {amp}: {back:?}");
        assert_eq!(
            calls(back, OpProfile::ACCUMULATE_GRAD),
            1,
            "amp {amp}: {back:?}"
        );
        assert!(fwd.iter().chain(back).all(|t| t.seconds > 0.0), "{times:?}");
    }
    // A bad index found by a deferred check while a synchronized profile waits is still the
    // program's to see at its own synchronisation.
    kiln::device::set_eager_checks(false);
    let table = Tensor::randn(&[4, 2], DType::F32, cuda).unwrap();
    let bad = Tensor::from_vec(vec![1i64, 7], &[2], cuda).unwrap();
    let profile = OpProfile::start_synchronized(cuda).unwrap();
    let picked = table.index_select(0, &bad).unwrap();
    let _ = picked.sum(&[], false).unwrap();
    let times = profile.finish();
    assert_eq!(calls(&times.forward, "IndexSelect"), 1, "{times:?}");
    let e = kiln::device::synchronize(cuda).unwrap_err().to_string();
    assert!(e.contains('7'), "{e}");
}
