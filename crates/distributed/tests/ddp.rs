//! DistributedDataParallel over the threads backend: N training steps on world 2 and 3 equal a
//! single-process run over the concatenated batches; no_sync accumulation; frozen and unused
//! parameters (averaged where another rank used them, left without a gradient where none
//! did); a second backward in one iteration refused; buckets started during backward; clipping
//! on the reduced gradients.
//!
//! Tolerance: every rank ends bit-identical to every other (one reduction order, one optimizer
//! arithmetic). Against the single-process run the gradients differ only by rounding: the
//! single process sums the batch in one matmul reduction and divides once, DDP sums each rank's
//! rows, divides by the rank's batch, then averages over ranks (f32, rank order). That is a few
//! f32 ulps per gradient element (~1e-7 relative); SGD momentum and AdamW carry it over the steps
//! without amplifying it much: after the steps here the parameters agree to 1e-6 relative
//! (`|a - b| / (1 + |b|)`; the measured worst cases, printed by the tests, are 2e-8 to 4e-8,
//! a few f32 ulps of values near 1).

mod common;

use common::*;
use kiln_autograd::Module;
use kiln_distributed::{DdpOptions, DistributedDataParallel, ProcessGroup, ThreadGroup};
use kiln_models::layers::Sequential;
use kiln_models::{Layer, LayerExt};
use std::sync::Arc;
use std::time::Duration;

const STEPS: usize = 4;
const B: usize = 3; // rows per rank per step
const TOL: f64 = 1e-6;
const T: Duration = Duration::from_secs(60);

fn wrap(
    model: Sequential,
    g: ThreadGroup,
    options: DdpOptions,
) -> DistributedDataParallel<Sequential> {
    let group: Arc<dyn ProcessGroup> = Arc::new(g);
    DistributedDataParallel::new(model, group, options).unwrap()
}

/// `make()`'s model holding the values every rank starts from (`init` with offset 0).
fn initialised(make: fn() -> Sequential) -> Sequential {
    let model = make();
    init(&model, 0.0);
    model
}

fn single_process(
    make: fn() -> Sequential,
    sample: &[usize],
    world: usize,
    opt: Opt,
) -> Vec<(String, Vec<f64>)> {
    let model = initialised(make);
    let mut o = optimizer(&model, opt);
    for step in 0..STEPS {
        let (x, y) = batch(step, world * B, sample);
        loss(&model.forward(&x).unwrap(), &y).backward().unwrap();
        o.step().unwrap();
        o.zero_grad(true).unwrap();
    }
    state(&model)
}

fn ddp_run(
    make: fn() -> Sequential,
    sample: &[usize],
    world: usize,
    opt: Opt,
    options: DdpOptions,
) -> Vec<Vec<(String, Vec<f64>)>> {
    ThreadGroup::run(world, T, |g| {
        let rank = g.rank();
        let model = make();
        init(&model, rank as f64); // only rank 0's values survive the broadcast
        let ddp = wrap(model, g, options);
        let mut o = optimizer(ddp.module(), opt);
        for step in 0..STEPS {
            let (x, y) = batch(step, world * B, sample);
            let out = ddp.forward(&rows(&x, rank, B)).unwrap();
            ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap();
            o.step().unwrap();
            o.zero_grad(true).unwrap();
        }
        state(ddp.module())
    })
    .unwrap()
}

fn check_equal(
    name: &str,
    make: fn() -> Sequential,
    ranks: &[Vec<(String, Vec<f64>)>],
    want: &[(String, Vec<f64>)],
) {
    for (r, s) in ranks.iter().enumerate() {
        assert_eq!(s, &ranks[0], "{name}: rank {r} differs from rank 0");
    }
    let (worst, at) = max_rel_diff(&ranks[0], want);
    println!("{name}: worst relative difference to the single process {worst:.2e} at {at}");
    assert!(worst < TOL, "{name}: {worst} at {at}");
    // The run must have moved the parameters, or the comparison proves nothing.
    let mut start = {
        let m = make();
        init(&m, 0.0);
        state(&m)
    };
    start.retain(|(n, _)| want.iter().any(|(w, _)| w == n));
    assert!(
        max_rel_diff(&ranks[0], &start).0 > 1e-3,
        "{name}: training did not move"
    );
}

#[test]
fn mlp_training_equals_the_single_process_run_for_sgd_momentum_and_adamw() {
    for world in [2, 3] {
        for opt in [Opt::SgdMomentum, Opt::AdamW] {
            let want = single_process(mlp, &[4], world, opt);
            let got = ddp_run(mlp, &[4], world, opt, DdpOptions::default());
            check_equal(&format!("mlp world {world} {opt:?}"), mlp, &got, &want);
            // Many small buckets reduce to the same numbers as one bucket.
            let small = ddp_run(
                mlp,
                &[4],
                world,
                opt,
                DdpOptions::default().bucket_cap_mb(1e-4),
            );
            assert_eq!(small, got, "bucket size changes nothing but the overlap");
        }
    }
}

/// The single-process reference of DDP with BatchNorm: one forward per rank's rows (batch
/// statistics per rank, as each process computes them), the mean of the per-rank losses, and,
/// as with `broadcast_buffers`, the running statistics rank 0's forward produced.
fn single_process_per_rank_forwards(world: usize, opt: Opt) -> Vec<(String, Vec<f64>)> {
    let model = initialised(conv_bn);
    let mut o = optimizer(&model, opt);
    for step in 0..STEPS {
        let (x, y) = batch(step, world * B, &[2, 4, 4]);
        let mut total = None;
        let mut rank0_buffers = Vec::new();
        for r in 0..world {
            let l = loss(&model.forward(&rows(&x, r, B)).unwrap(), &rows(&y, r, B));
            if r == 0 {
                rank0_buffers = model
                    .named_buffers()
                    .into_iter()
                    .map(|(_, b)| b.copy_data().unwrap())
                    .collect();
            }
            total = Some(match total {
                None => l,
                Some(t) => l.add(&t).unwrap(),
            });
        }
        total
            .unwrap()
            .mul_scalar(1.0 / world as f64)
            .unwrap()
            .backward()
            .unwrap();
        for ((_, b), saved) in model.named_buffers().iter().zip(&rank0_buffers) {
            kiln_autograd::no_grad(|| b.copy_(saved)).unwrap();
        }
        o.step().unwrap();
        o.zero_grad(true).unwrap();
    }
    state(&model)
}

#[test]
fn conv_batchnorm_training_equals_per_rank_forwards_with_rank0_buffers() {
    for world in [2, 3] {
        let opt = Opt::SgdMomentum;
        let want = single_process_per_rank_forwards(world, opt);
        let got = ThreadGroup::run(world, T, |g| {
            let rank = g.rank();
            let model = conv_bn();
            init(&model, rank as f64);
            let ddp = wrap(model, g, DdpOptions::default());
            let mut o = optimizer(ddp.module(), opt);
            for step in 0..STEPS {
                let (x, y) = batch(step, world * B, &[2, 4, 4]);
                let out = ddp.forward(&rows(&x, rank, B)).unwrap();
                ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap();
                o.step().unwrap();
                o.zero_grad(true).unwrap();
            }
            let before = state(ddp.module());
            // The same rows on every rank: after the forward's re-broadcast from rank 0 and one
            // identical update, every rank must hold the same statistics.
            ddp.forward(&rows(&batch(99, world * B, &[2, 4, 4]).0, 0, B))
                .unwrap();
            let buffers: Vec<Vec<f64>> = ddp
                .module()
                .named_buffers()
                .into_iter()
                .map(|(_, b)| b.to_vec_f64().unwrap())
                .collect();
            (before, buffers)
        })
        .unwrap();
        let is_param = |n: &str| n.ends_with("weight") || n.ends_with("bias");
        let split = |s: &[(String, Vec<f64>)], params: bool| -> Vec<(String, Vec<f64>)> {
            s.iter()
                .filter(|(n, _)| is_param(n) == params)
                .cloned()
                .collect()
        };
        let params: Vec<_> = got.iter().map(|(s, _)| split(s, true)).collect();
        check_equal(
            &format!("conv+bn world {world}"),
            conv_bn,
            &params,
            &split(&want, true),
        );
        // Rank 0's running statistics are the reference's (rank 0's forwards).
        let (worst, at) = max_rel_diff(&split(&got[0].0, false), &split(&want, false));
        assert!(
            worst < TOL,
            "world {world}: rank 0's buffer {at} differs by {worst}"
        );
        for (r, (_, bufs)) in got.iter().enumerate() {
            assert_eq!(
                bufs, &got[0].1,
                "world {world}: rank {r}'s buffers differ from rank 0's"
            );
        }
    }
}

#[test]
fn broadcast_buffers_off_keeps_batchnorm_statistics_per_process() {
    let got = ThreadGroup::run(2, T, |g| {
        let rank = g.rank();
        let ddp = wrap(
            initialised(conv_bn),
            g,
            DdpOptions::default().broadcast_buffers(false),
        );
        let (x, y) = batch(0, 2 * B, &[2, 4, 4]);
        for _ in 0..2 {
            let out = ddp.forward(&rows(&x, rank, B)).unwrap();
            ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap();
        }
        let params: Vec<_> = ddp
            .module()
            .parameters()
            .iter()
            .map(|p| p.to_vec_f64().unwrap())
            .collect();
        let mean = ddp.module().named_buffers()[0].1.to_vec_f64().unwrap();
        (params, mean)
    })
    .unwrap();
    assert_eq!(got[0].0, got[1].0, "parameters stay in sync");
    assert_ne!(got[0].1, got[1].1, "running statistics are each rank's own");
}

#[test]
fn no_sync_accumulation_equals_the_larger_batch() {
    const K: usize = 3; // micro-batches per step
    for world in [2, 3] {
        let want = {
            let model = initialised(mlp);
            let mut o = optimizer(&model, Opt::SgdMomentum);
            for step in 0..2 {
                let (x, y) = batch(step, world * K * B, &[4]);
                loss(&model.forward(&x).unwrap(), &y).backward().unwrap();
                o.step().unwrap();
                o.zero_grad(true).unwrap();
            }
            state(&model)
        };
        let got = ThreadGroup::run(world, T, |g| {
            let rank = g.rank();
            let ddp = wrap(initialised(mlp), g, DdpOptions::default());
            let mut o = optimizer(ddp.module(), Opt::SgdMomentum);
            for step in 0..2 {
                let (x, y) = batch(step, world * K * B, &[4]);
                // Rank r takes micro-batches r*K .. r*K + K of B rows each.
                let micro = |k: usize| {
                    let out = ddp.forward(&rows(&x, rank * K + k, B)).unwrap();
                    loss(&out, &rows(&y, rank * K + k, B))
                        .mul_scalar(1.0 / K as f64)
                        .unwrap()
                };
                {
                    let _local = ddp.no_sync();
                    for k in 0..K - 1 {
                        micro(k).backward().unwrap();
                        ddp.finish().unwrap(); // nothing to do inside no_sync
                    }
                }
                ddp.backward(&micro(K - 1)).unwrap();
                assert_eq!(
                    ddp.last_stats().hooks,
                    6,
                    "the synced backward reduced every parameter"
                );
                o.step().unwrap();
                o.zero_grad(true).unwrap();
            }
            state(ddp.module())
        })
        .unwrap();
        check_equal(&format!("no_sync world {world}"), mlp, &got, &want);
    }
}

#[test]
fn frozen_parameters_are_not_bucketed_and_stay_untouched() {
    let got = ThreadGroup::run(2, T, |g| {
        let rank = g.rank();
        let model = mlp();
        init(&model, rank as f64);
        let named = model.named_parameters();
        named[0].1.set_requires_grad(false).unwrap(); // 0.weight
        named[3].1.set_requires_grad(false).unwrap(); // 2.bias
        let ddp = wrap(model, g, DdpOptions::default());
        let frozen_start = (
            named[0].1.to_vec_f64().unwrap(),
            named[3].1.to_vec_f64().unwrap(),
        );
        let mut o = optimizer(ddp.module(), Opt::AdamW);
        for step in 0..3 {
            let (x, y) = batch(step, 2 * B, &[4]);
            let out = ddp.forward(&rows(&x, rank, B)).unwrap();
            ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap();
            o.step().unwrap();
            o.zero_grad(true).unwrap();
        }
        let bucketed: Vec<String> = ddp
            .buckets()
            .iter()
            .flat_map(|b| b.params.clone())
            .map(|i| ddp.bucketed_names()[i].clone())
            .collect();
        let frozen_end = (
            named[0].1.to_vec_f64().unwrap(),
            named[3].1.to_vec_f64().unwrap(),
        );
        (
            bucketed,
            frozen_start,
            frozen_end,
            named[0].1.grad().is_none(),
        )
    })
    .unwrap();
    for (bucketed, start, end, no_grad) in &got {
        assert_eq!(
            bucketed,
            &["4.bias", "4.weight", "2.weight", "0.bias"],
            "reverse order, frozen skipped"
        );
        assert_eq!(start, end);
        assert!(no_grad);
        // Frozen parameters were still broadcast from rank 0.
        assert_eq!(start, &got[0].1);
    }
}

#[test]
fn buckets_start_all_reduces_before_backward_ends() {
    let got = ThreadGroup::run(2, T, |g| {
        let rank = g.rank();
        // 1e-4 MiB = 104 bytes: every parameter of this MLP but the output bias (3 floats = 12
        // bytes) and the next one closes its bucket alone.
        let ddp = wrap(
            initialised(mlp),
            g,
            DdpOptions::default().bucket_cap_mb(1e-4),
        );
        let buckets: Vec<Vec<usize>> = ddp.buckets().iter().map(|b| b.params.clone()).collect();
        let (x, y) = batch(0, 2 * B, &[4]);
        let out = ddp.forward(&rows(&x, rank, B)).unwrap();
        ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap();
        (buckets, ddp.last_stats())
    })
    .unwrap();
    for (buckets, stats) in got {
        // Parameters (registration order): 0.weight 64, 0.bias 16, 2.weight 128, 2.bias 8,
        // 4.weight 24, 4.bias 3 floats.
        assert_eq!(buckets, vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
        assert_eq!(stats.buckets, 3);
        assert_eq!(stats.hooks, 6);
        // The first two buckets started while backward still ran; only the last one started
        // at the last hook.
        assert_eq!(stats.started_before_last_hook, 2);
    }
}

/// Each parameter's gradient after one backward over `x`, `y` (None where it has none).
fn grads_of(model: &dyn Module) -> Vec<Option<Vec<f64>>> {
    model
        .named_parameters()
        .iter()
        .map(|(_, p)| p.grad().map(|g| g.to_vec_f64().unwrap()))
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let named = |v: &[f64]| [(what.to_string(), v.to_vec())];
    let (worst, _) = max_rel_diff(&named(got), &named(want));
    assert!(worst <= TOL, "{what}: {got:?} vs {want:?}");
}

/// `0.bias` frozen after wrapping (still bucketed, but backward gives it no gradient) on the
/// ranks in `frozen_on`. Without `find_unused_parameters` that is an error naming it; with it
/// the rest is averaged as usual, `0.bias` gets the average where another rank used it
/// (rank 0's gradient / 2) and keeps no gradient where no rank did (PyTorch's rule).
#[test]
fn unused_parameters_are_named_or_reduced_as_zeros_on_request() {
    let (x, y) = batch(0, 2 * B, &[4]);
    let reference = |rows_of: Option<usize>| {
        let model = initialised(mlp);
        let (x, y) = match rows_of {
            Some(r) => (rows(&x, r, B), rows(&y, r, B)),
            None => (x.clone(), y.clone()),
        };
        loss(&model.forward(&x).unwrap(), &y).backward().unwrap();
        grads_of(&model)
    };
    let (whole, rank0) = (reference(None), reference(Some(0)));
    for (find_unused, frozen_on) in [(false, &[0, 1][..]), (true, &[0, 1]), (true, &[1])] {
        let got = ThreadGroup::run(2, T, |g| {
            let rank = g.rank();
            let ddp = wrap(
                initialised(mlp),
                g,
                DdpOptions::default().find_unused_parameters(find_unused),
            );
            if frozen_on.contains(&rank) {
                ddp.module().named_parameters()[1]
                    .1
                    .set_requires_grad(false)
                    .unwrap();
            }
            let out = ddp.forward(&rows(&x, rank, B)).unwrap();
            let result = ddp.backward(&loss(&out, &rows(&y, rank, B)));
            let grads = grads_of(ddp.module());
            (
                result.map_err(|e| e.to_string()),
                ddp.last_stats().unused,
                grads,
            )
        })
        .unwrap();
        for (rank, (result, unused, grads)) in got.into_iter().enumerate() {
            if !find_unused {
                let msg = result.unwrap_err();
                assert!(
                    msg.starts_with(&format!("rank {rank}: DistributedDataParallel")),
                    "{msg}"
                );
                assert!(
                    msg.contains("got no gradient in this backward: 0.bias;"),
                    "{msg}"
                );
                assert!(msg.contains("find_unused_parameters(true)"), "{msg}");
                continue;
            }
            result.unwrap();
            let frozen_here = frozen_on.contains(&rank);
            assert_eq!(unused, if frozen_here { &["0.bias"][..] } else { &[] });
            for (i, g) in grads.iter().enumerate() {
                let what = format!("rank {rank}, frozen on {frozen_on:?}, parameter {i}");
                match (i, frozen_on.len()) {
                    (1, 2) => assert!(g.is_none(), "{what}: no rank used it"),
                    (1, _) => {
                        let half: Vec<f64> =
                            rank0[1].as_ref().unwrap().iter().map(|v| v / 2.0).collect();
                        assert_close(g.as_ref().unwrap(), &half, &what);
                    }
                    _ => assert_close(g.as_ref().unwrap(), whole[i].as_ref().unwrap(), &what),
                }
            }
        }
    }
}

#[test]
fn clip_grad_norm_on_the_reduced_gradients_is_the_same_on_every_rank() {
    let world = 3;
    let want = {
        let model = initialised(mlp);
        let (x, y) = batch(0, world * B, &[4]);
        loss(&model.forward(&x).unwrap(), &y).backward().unwrap();
        kiln_optim::clip_grad_norm_(&model.named_parameters(), 0.1, 2.0, false).unwrap()
    };
    let got = ThreadGroup::run(world, T, |g| {
        let rank = g.rank();
        let ddp = wrap(initialised(mlp), g, DdpOptions::default());
        let (x, y) = batch(0, world * B, &[4]);
        let out = ddp.forward(&rows(&x, rank, B)).unwrap();
        loss(&out, &rows(&y, rank, B)).backward().unwrap();
        let params = ddp.module().named_parameters();
        let grad_norm = || {
            let grads: Vec<_> = params.iter().map(|(_, p)| p.grad().unwrap()).collect();
            kiln_optim::get_total_norm(&grads, 2.0, false).unwrap()
        };
        let local = grad_norm();
        ddp.finish().unwrap();
        let norm = kiln_optim::clip_grad_norm_(&params, 0.1, 2.0, false).unwrap();
        (local, norm, grad_norm())
    })
    .unwrap();
    assert_ne!(
        got[0].0, got[1].0,
        "the local norms differ before the reduction"
    );
    for (_, norm, clipped) in &got {
        assert_eq!(
            norm.to_bits(),
            got[0].1.to_bits(),
            "the same norm on every rank"
        );
        assert!(
            (norm - want).abs() < 1e-5 * want,
            "{norm} vs single process {want}"
        );
        assert!(
            want > 0.1 && (clipped - 0.1).abs() < 1e-5,
            "clipped to max_norm: {clipped}"
        );
    }
}

#[test]
fn a_forward_before_finish_and_a_peer_that_left_are_errors() {
    let got = ThreadGroup::run(2, Duration::from_secs(20), |g| {
        let rank = g.rank();
        let ddp = wrap(initialised(mlp), g, DdpOptions::default());
        let (x, y) = batch(0, 2 * B, &[4]);
        let out = ddp.forward(&rows(&x, rank, B)).unwrap();
        loss(&out, &rows(&y, rank, B)).backward().unwrap();
        let early = ddp.forward(&rows(&x, rank, B)).unwrap_err().to_string();
        ddp.finish().unwrap();
        if rank == 1 {
            return (early, None); // rank 1 leaves
        }
        let out = ddp.forward(&rows(&x, rank, B)).unwrap();
        let err = ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap_err();
        (early, Some(err.to_string()))
    })
    .unwrap();
    assert!(
        got[0]
            .0
            .contains("call finish() after every synced backward"),
        "{}",
        got[0].0
    );
    let msg = got[0].1.as_ref().unwrap();
    assert!(msg.contains("rank 1 left the group"), "{msg}");
}

/// A hostile bucket size is refused before any collective, echoed as -1e300, not 301 digits.
#[test]
fn a_hostile_bucket_size_is_refused_in_short_form() {
    let got = ThreadGroup::run(1, T, |g| {
        let options = DdpOptions::default().bucket_cap_mb(-1e300);
        let made = DistributedDataParallel::new(initialised(mlp), Arc::new(g), options);
        made.err().map(|e| e.to_string())
    });
    let msg = got.unwrap().remove(0).expect("refused");
    assert!(msg.contains("bucket_cap_mb is -1e300;"), "{msg}");
}

/// A second backward through one synced forward would add a gradient after its bucket was
/// launched: the hook refuses it, backward fails, and `finish` gives the error naming the
/// parameter (the first backward's all-reduces are waited for, not left running).
#[test]
fn a_second_backward_in_one_iteration_is_refused() {
    let got = ThreadGroup::run(2, T, |g| {
        let rank = g.rank();
        let ddp = wrap(initialised(mlp), g, DdpOptions::default());
        let (x, y) = batch(0, 2 * B, &[4]);
        let out = ddp.forward(&rows(&x, rank, B)).unwrap();
        let l = loss(&out, &rows(&y, rank, B));
        l.backward_with(None, true).unwrap();
        let second = l.backward().map_err(|e| e.to_string());
        (second.unwrap_err(), ddp.finish().unwrap_err().to_string())
    })
    .unwrap();
    for (rank, (second, finish)) in got.iter().enumerate() {
        for msg in [second, finish] {
            assert!(
                msg.contains("got a second gradient in one iteration"),
                "rank {rank}: {msg}"
            );
        }
        assert!(finish.starts_with(&format!("rank {rank}: ")), "{finish}");
    }
}
