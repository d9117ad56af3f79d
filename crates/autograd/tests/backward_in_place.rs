//! Backward reuses the incoming gradient's buffer where nothing else holds it: the sum of two
//! paths' gradients goes into the first one's, and an elementwise rule (ReLU's, sigmoid's,
//! tanh's, exp's, log's) writes its result over the gradient it reads; where something does
//! hold it (a custom op's backward that kept its result, a view of it) the result is a new
//! buffer. Measured with the CPU caching allocator's statistics: its own test binary, since
//! that allocator is process-wide.

use kiln_autograd::{DType, Device, Tensor};
use kiln_device::{max_memory_allocated, memory_allocated, reset_peak_memory_stats};
use std::sync::{Arc, Mutex};

const N: usize = 1 << 20; // 4 MiB of f32 per gradient
const BYTES: usize = N * 4;

/// The allocator's statistics are process-wide: one measuring test at a time.
static ALLOCATOR: Mutex<()> = Mutex::new(());

/// Runs `loss.backward()`: the growth of allocated bytes over it (from the forward's end), and
/// the gradient of `x`.
fn backward_growth(loss: &Tensor, x: &Tensor) -> (usize, Vec<f32>) {
    reset_peak_memory_stats(Device::Cpu).unwrap();
    let base = memory_allocated(Device::Cpu).unwrap();
    loss.backward().unwrap();
    let grew = max_memory_allocated(Device::Cpu).unwrap() - base;
    (grew, x.grad().unwrap().to_vec::<f32>().unwrap())
}

/// `h * factor`, through a custom op when `spy` is given, whose backward keeps a handle to the
/// gradient it returns.
fn scaled(h: &Tensor, factor: f64, spy: Option<&Arc<Mutex<Vec<Tensor>>>>) -> Tensor {
    let Some(kept) = spy else {
        return h.mul_scalar(factor).unwrap();
    };
    let kept = Arc::clone(kept);
    let out = kiln_autograd::no_grad(|| h.mul_scalar(factor)).unwrap();
    Tensor::record_op("KeepBackward", &[h], &out, move |_| {
        Box::new(move |g| {
            let scaled = g.mul_scalar(factor)?;
            kept.lock().unwrap().push(scaled.clone());
            Ok(vec![Some(scaled)])
        })
    })
}

/// `(h * 3 + h * 5).sum()`, `h = x * 2`, with the two products' gradients meeting at `h`: the
/// growth of allocated bytes over backward (from the forward's end), and `x`'s gradient.
fn meeting_paths(spy: Option<&Arc<Mutex<Vec<Tensor>>>>) -> (usize, Vec<f32>) {
    let cpu = Device::Cpu;
    let x = Tensor::full(&[N], 1.0, DType::F32, cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let h = x.mul_scalar(2.0).unwrap();
    let (a, b) = (scaled(&h, 3.0, spy), scaled(&h, 5.0, spy));
    let loss = a.add(&b).unwrap().sum_all().unwrap();
    backward_growth(&loss, &x)
}

#[test]
fn a_sum_of_two_paths_goes_into_an_unshared_buffer_and_never_into_a_shared_one() {
    let _alone = ALLOCATOR.lock().unwrap_or_else(|p| p.into_inner());
    // In place: at the sum, the two products' gradients (3g, 5g) are alive; the sum takes no
    // third buffer. Then h's backward makes 2 * 8g and the leaf keeps it as its gradient.
    let (grew, grad) = meeting_paths(None);
    assert!(grad.iter().all(|&v| v == 16.0), "{:?}", &grad[..4]);
    // Backward's buffers at their most: the two products' gradients (sum_all's gradient is
    // an expanded scalar), the sum taking the first one's place; x's gradient replaces them.
    assert!(
        grew <= 2 * BYTES + 4096,
        "backward grew allocated bytes by {grew}, more than two {BYTES}-byte gradients"
    );
    // Both products kept by a custom op: whichever gradient arrives first, the sum is a new
    // buffer and the kept gradients are unchanged.
    let kept = Arc::new(Mutex::new(Vec::new()));
    let (grew_kept, grad) = meeting_paths(Some(&kept));
    assert!(grad.iter().all(|&v| v == 16.0), "{:?}", &grad[..4]);
    let mut seen: Vec<Vec<f32>> = kept
        .lock()
        .unwrap()
        .iter()
        .map(|t| t.to_vec::<f32>().unwrap())
        .collect();
    seen.sort_by(|p, q| p[0].total_cmp(&q[0]));
    assert_eq!(seen.len(), 2);
    for (values, want) in seen.iter().zip([3.0, 5.0]) {
        assert!(
            values.iter().all(|&v| v == want),
            "a gradient a custom op kept was changed by the sum: {:?}, not {want}",
            &values[..4]
        );
    }
    // ... which costs the third buffer the unshared case saved.
    assert!(
        grew_kept + 4096 >= grew + BYTES,
        "kept: {grew_kept} bytes, unshared: {grew}"
    );
}

#[test]
fn expanded_gradients_meeting_are_summed_into_a_new_buffer() {
    let _alone = ALLOCATOR.lock().unwrap_or_else(|p| p.into_inner());
    // Each sum's backward hands on its gradient as an expanded scalar (stride 0): adding into
    // such a view in place would be refused (its elements share one place in memory).
    let x = Tensor::full(&[4, 3], 1.0, DType::F32, Device::Cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let h = x.mul_scalar(2.0).unwrap();
    let loss = h
        .sum_all()
        .unwrap()
        .add(&h.sum_all().unwrap().mul_scalar(3.0).unwrap())
        .unwrap();
    loss.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![8.0; 12]);
}

/// `relu(x) * 3`, summed: the growth of allocated bytes over backward and `x`'s gradient. With
/// `keep`, a custom op between the ReLU and the product keeps a handle to the gradient it hands
/// to the ReLU.
fn relu_chain(keep: Option<&Arc<Mutex<Vec<Tensor>>>>) -> (usize, Vec<f32>) {
    let cpu = Device::Cpu;
    let values: Vec<f32> = (0..N).map(|i| (i % 7) as f32 - 2.5).collect();
    let x = Tensor::from_vec(values, &[N], cpu).unwrap();
    x.set_requires_grad(true).unwrap();
    let r = match keep {
        Some(_) => scaled(&x.relu().unwrap(), 1.0, keep),
        None => x.relu().unwrap(),
    };
    let loss = r.mul_scalar(3.0).unwrap().sum_all().unwrap();
    backward_growth(&loss, &x)
}

#[test]
fn relu_backward_writes_over_a_gradient_nobody_else_holds() {
    let _alone = ALLOCATOR.lock().unwrap_or_else(|p| p.into_inner());
    // d/dx = 3 where x = i % 7 - 2.5 > 0, else 0.
    let want = |i: usize| if i % 7 >= 3 { 3.0 } else { 0.0 };
    let (grew, grad) = relu_chain(None);
    assert!(grad.iter().enumerate().all(|(i, &g)| g == want(i)));
    // The product's gradient (3 everywhere) becomes the ReLU's, then x's: one gradient-sized
    // buffer in all.
    assert!(
        grew <= BYTES + 4096,
        "backward grew allocated bytes by {grew}, more than one {BYTES}-byte gradient"
    );
    // A gradient something else holds is read, not written over.
    let kept = Arc::new(Mutex::new(Vec::new()));
    let (grew_kept, grad) = relu_chain(Some(&kept));
    assert!(grad.iter().enumerate().all(|(i, &g)| g == want(i)));
    let kept = kept.lock().unwrap();
    assert_eq!(kept.len(), 1);
    let seen = kept[0].to_vec::<f32>().unwrap();
    assert!(
        seen.iter().all(|&v| v == 3.0),
        "ReLU's backward changed a gradient a custom op kept: {:?}",
        &seen[..8]
    );
    assert!(
        grew_kept + 4096 >= grew + BYTES,
        "kept: {grew_kept} bytes, unshared: {grew}"
    );
}

#[test]
fn sigmoid_tanh_exp_and_log_backward_write_over_the_gradient() {
    let _alone = ALLOCATOR.lock().unwrap_or_else(|p| p.into_inner());
    type Forward = fn(&Tensor) -> Tensor;
    type Rule = fn(f32, f32) -> f32;
    // Each rule from the forward's input x and output y, for an incoming gradient of 3, in
    // the order PyTorch's kernels compute it (sigmoid: g * (1 - y) * y; tanh: g * (1 - y * y)).
    let cases: [(&str, Forward, Rule); 4] = [
        (
            "sigmoid",
            |x| x.sigmoid().unwrap(),
            |_, y| 3.0 * (1.0 - y) * y,
        ),
        ("tanh", |x| x.tanh().unwrap(), |_, y| 3.0 * (1.0 - y * y)),
        ("exp", |x| x.exp().unwrap(), |_, y| 3.0 * y),
        ("log", |x| x.log().unwrap(), |x, _| 3.0 / x),
    ];
    for (name, forward, rule) in cases {
        let values: Vec<f32> = (0..N).map(|i| 0.25 + (i % 7) as f32 * 0.5).collect();
        let x = Tensor::from_vec(values.clone(), &[N], Device::Cpu).unwrap();
        x.set_requires_grad(true).unwrap();
        let y = forward(&x);
        let ys = y.to_vec::<f32>().unwrap();
        let loss = y.mul_scalar(3.0).unwrap().sum_all().unwrap();
        let (grew, grad) = backward_growth(&loss, &x);
        for (i, &g) in grad.iter().enumerate().step_by(997) {
            let want = rule(values[i], ys[i]);
            assert_eq!(g.to_bits(), want.to_bits(), "{name} at {i}: {g} != {want}");
        }
        // The product's gradient becomes the activation's, then x's: one buffer in all.
        assert!(
            grew <= BYTES + 4096,
            "{name}: backward grew allocated bytes by {grew}, more than one {BYTES}-byte gradient"
        );
    }
}
