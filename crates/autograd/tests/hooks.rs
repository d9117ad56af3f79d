//! Post-accumulate-grad hooks: when the engine calls them, what they see, and removal.

use kiln_autograd::{Device, Error, Tensor};
use std::sync::{Arc, Mutex};

fn leaf(v: &[f64]) -> Tensor {
    let t = Tensor::from_slice(v, &[v.len()], Device::Cpu).unwrap();
    t.set_requires_grad(true).unwrap();
    t
}

type Log = Arc<Mutex<Vec<(String, Vec<f64>)>>>;

/// Registers a hook on `t` that logs `name` and the gradient it sees.
fn log_hook(t: &Tensor, name: &str, log: &Log) -> kiln_autograd::HookHandle {
    let (name, log) = (name.to_string(), log.clone());
    t.register_post_accumulate_grad_hook(move |leaf| {
        let g = leaf
            .grad()
            .expect("the gradient was accumulated before the hook");
        log.lock().unwrap().push((name.clone(), g.to_vec::<f64>()?));
        Ok(())
    })
    .unwrap()
}

fn names(log: &Log) -> Vec<String> {
    log.lock().unwrap().iter().map(|(n, _)| n.clone()).collect()
}

#[test]
fn hooks_run_once_per_backward_in_the_engines_order_and_not_for_unreached_leaves() {
    let (x, a, b, unused) = (
        leaf(&[1.0, 2.0]),
        leaf(&[3.0, 4.0]),
        leaf(&[5.0, 6.0]),
        leaf(&[7.0]),
    );
    let log: Log = Arc::default();
    let _handles: Vec<_> = [(&x, "x"), (&a, "a"), (&b, "b"), (&unused, "unused")]
        .into_iter()
        .map(|(t, n)| log_hook(t, n, &log))
        .collect();
    // sum((x * a) * b): the engine reaches b at the outer mul, then x and a at the inner one.
    let loss = || x.mul(&a).unwrap().mul(&b).unwrap().sum_all().unwrap();
    loss().backward().unwrap();
    assert_eq!(names(&log), ["b", "x", "a"]);
    loss().backward().unwrap();
    assert_eq!(names(&log), ["b", "x", "a", "b", "x", "a"]);
    let log = log.lock().unwrap();
    // Second backward: every gradient doubled (accumulated over the two calls).
    assert_eq!(log[3].1, vec![2.0 * 3.0 * 1.0, 2.0 * 4.0 * 2.0]);
    assert_eq!(log[4].1, vec![2.0 * 15.0, 2.0 * 24.0]);
    assert_eq!(log[5].1, vec![2.0 * 5.0, 2.0 * 12.0]);
    assert!(unused.grad().is_none());
}

#[test]
fn a_leaf_used_on_several_paths_is_accumulated_once_with_the_sum() {
    let x = leaf(&[1.0, 2.0]);
    x.set_grad(Some(
        Tensor::from_slice(&[10.0, 20.0], &[2], Device::Cpu).unwrap(),
    ))
    .unwrap();
    let log: Log = Arc::default();
    let _h = log_hook(&x, "x", &log);
    // d/dx sum(x*x + 3x + exp(x)) = 2x + 3 + exp(x), from three paths into x.
    let y = x
        .mul(&x)
        .unwrap()
        .add(&x.mul_scalar(3.0).unwrap())
        .unwrap()
        .add(&x.exp().unwrap())
        .unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 1, "one call for one backward");
    let want = [10.0 + 2.0 + 3.0 + 1f64.exp(), 20.0 + 4.0 + 3.0 + 2f64.exp()];
    for (got, want) in log[0].1.iter().zip(want) {
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }
}

#[test]
fn a_removed_hook_is_not_called_and_the_others_still_are() {
    let x = leaf(&[1.0]);
    let log: Log = Arc::default();
    let first = log_hook(&x, "first", &log);
    let _second = log_hook(&x, "second", &log);
    x.mul_scalar(2.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(names(&log), ["first", "second"], "registration order");
    first.remove();
    x.mul_scalar(2.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(names(&log), ["first", "second", "second"]);
}

#[test]
fn a_detached_view_does_not_inherit_the_hook_and_a_leaf_root_calls_it() {
    let x = leaf(&[1.0, 2.0]);
    let log: Log = Arc::default();
    let _h = log_hook(&x, "x", &log);
    let view = x.detach();
    view.set_requires_grad(true).unwrap();
    view.sum_all().unwrap().backward().unwrap();
    assert!(names(&log).is_empty());
    let g = Tensor::from_slice(&[1.0, 1.0], &[2], Device::Cpu).unwrap();
    x.backward_with(Some(&g), false).unwrap();
    assert_eq!(names(&log), ["x"]);
}

#[test]
fn a_hook_error_stops_backward_and_bad_registrations_are_refused() {
    let x = leaf(&[1.0]);
    let h = x
        .register_post_accumulate_grad_hook(|_| Err(Error::Autograd("rank 1 failed".into())))
        .unwrap();
    let err = x.exp().unwrap().sum_all().unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("rank 1 failed"), "{err}");
    h.remove();
    x.exp().unwrap().sum_all().unwrap().backward().unwrap();

    let y = x.exp().unwrap();
    let err = y
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .unwrap_err();
    assert!(err.to_string().contains("only leaf tensors"), "{err}");
    let frozen = Tensor::from_slice(&[1.0], &[1], Device::Cpu).unwrap();
    let err = frozen
        .register_post_accumulate_grad_hook(|_| Ok(()))
        .unwrap_err();
    assert!(err.to_string().contains("does not require grad"), "{err}");
}
