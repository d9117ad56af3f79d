//! The threads backend: every collective's values, the fixed reduction order, asynchronous
//! all-reduce completing in start order, and failures that name the rank instead of hanging.

use kiln_autograd::{DType, Device, Tensor};
use kiln_distributed::{BackendKind, Error, ProcessGroup, ReduceOp, ThreadGroup};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

fn t32(v: &[f32]) -> Tensor {
    Tensor::from_slice(v, &[v.len()], Device::Cpu).unwrap()
}

fn v32(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn every_collective_gives_the_values_of_its_definition() {
    let out = ThreadGroup::run(3, T, |g| {
        let r = g.rank() as f32;
        assert_eq!(
            (g.world_size(), g.local_rank(), g.backend()),
            (3, g.rank(), BackendKind::Threads)
        );
        let sum = t32(&[r, 10.0 * r]);
        g.all_reduce(&sum, ReduceOp::Sum).unwrap();
        let avg = t32(&[r, 1.0]);
        g.all_reduce(&avg, ReduceOp::Avg).unwrap();
        let max = t32(&[r, -r]);
        g.all_reduce(&max, ReduceOp::Max).unwrap();
        let b = t32(&[r + 1.0, r + 2.0]);
        g.broadcast(&b, 2).unwrap();
        let gathered = Tensor::zeros(&[6], DType::F32, Device::Cpu).unwrap();
        g.all_gather(&t32(&[r, r + 0.5]), &gathered).unwrap();
        let scattered = Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap();
        let input: Vec<f32> = (0..6).map(|i| i as f32 * (r + 1.0)).collect();
        g.reduce_scatter(&t32(&input), &scattered, ReduceOp::Sum)
            .unwrap();
        g.barrier().unwrap();
        [
            v32(&sum),
            v32(&avg),
            v32(&max),
            v32(&b),
            v32(&gathered),
            v32(&scattered),
        ]
    })
    .unwrap();
    for (rank, o) in out.iter().enumerate() {
        assert_eq!(o[0], vec![3.0, 30.0]);
        assert_eq!(o[1], vec![1.0, 1.0]);
        assert_eq!(o[2], vec![2.0, 0.0]);
        assert_eq!(o[3], vec![3.0, 4.0]);
        assert_eq!(o[4], vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        // sum over ranks of i * (r + 1) = 6 i, chunk `rank` holds i = 2 rank, 2 rank + 1.
        let i = 2.0 * rank as f32;
        assert_eq!(o[5], vec![6.0 * i, 6.0 * (i + 1.0)]);
    }
}

#[test]
fn reductions_run_in_rank_order_in_the_dtypes_arithmetic() {
    // (1e8 + 1 + 1) in f32 rank order is 1e8 (each +1 is lost); the other order would give 1e8+2.
    let values = [1.0e8f32, 1.0, 1.0];
    let out = ThreadGroup::run(3, T, |g| {
        let t = t32(&[values[g.rank()]]);
        g.all_reduce(&t, ReduceOp::Sum).unwrap();
        let d = Tensor::from_slice(&[f64::from(values[g.rank()])], &[1], Device::Cpu).unwrap();
        g.all_reduce(&d, ReduceOp::Sum).unwrap();
        (v32(&t)[0], d.to_vec::<f64>().unwrap()[0])
    })
    .unwrap();
    let want_f32 = (1.0e8f32 + 1.0) + 1.0;
    assert_eq!(want_f32, 1.0e8);
    for (f, d) in out {
        assert_eq!(f.to_bits(), want_f32.to_bits());
        assert_eq!(d, 1.0e8 + 2.0);
    }
}

#[test]
fn async_all_reduces_complete_in_start_order_while_the_caller_goes_on() {
    let out = ThreadGroup::run(2, T, |g| {
        let tensors: Vec<Tensor> = (0..4).map(|i| t32(&[(g.rank() * 10 + i) as f32])).collect();
        let works: Vec<_> = tensors
            .iter()
            .map(|t| g.start_all_reduce(t, ReduceOp::Sum).unwrap())
            .collect();
        // A blocking collective issued after them runs after them (one queue per rank).
        let after = t32(&[1.0]);
        g.all_reduce(&after, ReduceOp::Sum).unwrap();
        for w in works {
            w.wait().unwrap();
        }
        let got: Vec<f32> = tensors.iter().map(|t| v32(t)[0]).collect();
        (got, v32(&after)[0])
    })
    .unwrap();
    for (got, after) in out {
        assert_eq!(got, vec![10.0, 12.0, 14.0, 16.0]);
        assert_eq!(after, 2.0);
    }
}

#[test]
fn a_rank_that_leaves_makes_the_others_fail_at_once_naming_it() {
    let start = Instant::now();
    let out = ThreadGroup::run(3, Duration::from_secs(30), |g| {
        let t = t32(&[1.0]);
        g.all_reduce(&t, ReduceOp::Sum).unwrap();
        if g.rank() == 1 {
            return None; // rank 1 stops participating; its handle is dropped here
        }
        Some(g.all_reduce(&t, ReduceOp::Sum).unwrap_err())
    })
    .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "failed fast, not at the timeout"
    );
    for (rank, err) in out.into_iter().enumerate() {
        let Some(err) = err else { continue };
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("rank {rank} of 3: all_reduce")),
            "{msg}"
        );
        assert!(msg.contains("rank 1 left the group"), "{msg}");
    }
}

#[test]
fn a_silent_rank_makes_the_others_time_out_and_mismatches_are_named() {
    let timeout = Duration::from_millis(300);
    let out = ThreadGroup::run(2, timeout, |g| {
        if g.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1200));
            return None;
        }
        let start = Instant::now();
        let err = g.barrier().unwrap_err();
        Some((err, start.elapsed()))
    })
    .unwrap();
    let (err, took) = out[0].as_ref().unwrap();
    assert!(
        matches!(
            err,
            Error::Timeout {
                rank: 0,
                op: "barrier",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        *took >= timeout && *took < Duration::from_secs(5),
        "{took:?}"
    );

    let out = ThreadGroup::run(2, T, |g| {
        let t = t32(&[1.0, 2.0]);
        if g.rank() == 0 {
            g.all_reduce(&t, ReduceOp::Sum).unwrap_err()
        } else {
            g.broadcast(&t, 0).unwrap_err()
        }
    })
    .unwrap();
    let msg = out[0].to_string();
    assert!(msg.contains("rank 0 of 2: all_reduce"), "{msg}");
    assert!(
        msg.contains("rank 1 issued broadcast(2 elements of float32, root 0)"),
        "{msg}"
    );
}

#[test]
fn bad_arguments_are_refused_before_any_rank_waits() {
    let g = ThreadGroup::new_group(1).unwrap().pop().unwrap();
    let t = t32(&[1.0, 2.0]);
    let msg = g.broadcast(&t, 1).unwrap_err().to_string();
    assert!(msg.contains("root 1 is not a rank"), "{msg}");
    let short = Tensor::zeros(&[3], DType::F32, Device::Cpu).unwrap();
    let msg = g.all_gather(&t, &short).unwrap_err().to_string();
    assert!(msg.contains("world_size (1) times"), "{msg}");
    let strided = Tensor::zeros(&[2, 2], DType::F32, Device::Cpu)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let msg = g
        .all_reduce(&strided, ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("not contiguous"), "{msg}");
    let ints = Tensor::zeros(&[2], DType::I64, Device::Cpu).unwrap();
    assert!(g.all_reduce(&ints, ReduceOp::Avg).is_err());
    g.all_reduce(&ints, ReduceOp::Sum).unwrap();
    assert!(ThreadGroup::new_group(0).is_err());
}
