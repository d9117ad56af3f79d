//! Deferred CUDA index checks (`crates/device/src/cuda/deferred/mod.rs`): a bad index does not fail
//! the op, it fails the thread's next synchronisation with the CPU's error; a good index costs no
//! wait; the device keeps working after the error; another thread's copy does not see it. One test function, because the counters and the
//! eager switch are per process. Skips without a GPU (`cuda_device_or_skip`).
#![cfg(feature = "cuda")]

mod common;

use kiln_device::cuda::deferred_check_stats;
use kiln_device::ops::loss::{CrossEntropyShape, CrossEntropySpec, TargetKind};
use kiln_device::prelude::*;
use kiln_device::testing::cuda_device_or_skip;
use kiln_device::Layout;
use kiln_device::{set_eager_checks, synchronize, CpuStorage, CudaStorage, Error};

use common::gpu;

fn host(s: &CudaStorage) -> Result<Vec<f32>, Error> {
    Ok(s.to_cpu(&Layout::contiguous(&[s.len()]))?
        .to_vec::<f32>()
        .unwrap())
}

#[test]
fn bad_indices_are_reported_at_the_next_synchronisation() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    set_eager_checks(false);
    let table_values: Vec<f32> = (0..40).map(|i| i as f32 * 0.5 - 3.0).collect();
    let table = CpuStorage::from_vec(table_values.clone());
    let (tl, il) = (Layout::contiguous(&[10, 4]), Layout::contiguous(&[2, 3]));
    let tg = gpu(dev, &table);

    // Good indices: the ops queue their checks and never wait for them.
    let good = CpuStorage::from_vec(vec![3i64, 0, 9, 9, 1, 2]);
    let gg = gpu(dev, &good);
    let before = deferred_check_stats(dev);
    let a = tg.embedding(&tl, (&gg, &il)).unwrap();
    let b = tg.index_select(&tl, 0, (&gg, &il)).unwrap();
    let after_ops = deferred_check_stats(dev);
    assert_eq!(after_ops.issued, before.issued + 2);
    assert_eq!(
        after_ops.reads, before.reads,
        "a checked op waited on the stream"
    );
    assert_eq!(after_ops.pending, before.pending + 2);
    let want = table.embedding(&tl, (&good, &il)).unwrap();
    let want_good = want.to_vec::<f32>().unwrap();
    assert_eq!(host(&a).unwrap(), want.to_vec::<f32>().unwrap());
    assert_eq!(host(&b).unwrap(), want.to_vec::<f32>().unwrap());
    // The first copy to the host read the record once; the second found nothing pending.
    let after_sync = deferred_check_stats(dev);
    assert_eq!(
        (after_sync.reads, after_sync.pending),
        (before.reads + 1, 0)
    );

    // A bad embedding index: no error at the op, nor at a later (also bad) op...
    let bad = CpuStorage::from_vec(vec![1i64, 2, 10, -1, 0, 0]);
    let embedding_err = table.embedding(&tl, (&bad, &il)).unwrap_err();
    let bg = gpu(dev, &bad);
    let out = tg.embedding(&tl, (&bg, &il)).unwrap();
    let later_bad = CpuStorage::from_vec(vec![0i64, 1, 2, 3, 2, 40]);
    let later = tg.gather(&tl, 1, (&gpu(dev, &later_bad), &il)).unwrap();
    assert_eq!(deferred_check_stats(dev).reads, after_sync.reads);
    // ...but the CPU's error, for the first bad op, at the next copy to the host.
    match host(&out) {
        Err(Error::DeferredCheck {
            op,
            device,
            reported_at,
            error,
        }) => {
            assert_eq!((op, device), ("embedding", dev));
            assert!(reported_at.contains("copy to the host"), "{reported_at}");
            assert_eq!(Some(&*error), embedding_err.kernel_error());
        }
        other => panic!("expected the deferred embedding error, got {other:?}"),
    }
    // Only the first failure is kept; the record is clear again, and the kernels touched
    // nothing through the bad indices: takes wrote 0 there.
    let t = &table_values;
    let want_rows: Vec<f32> = [&t[4..12], &[0.0; 8], &t[0..4], &t[0..4]].concat();
    assert_eq!(host(&out).unwrap(), want_rows);
    let want_gathered = vec![t[0], t[1], t[2], t[4 + 3], t[4 + 2], 0.0];
    assert_eq!(host(&later).unwrap(), want_gathered);

    // The device still works: a following op and its copy succeed.
    let again = tg.embedding(&tl, (&gg, &il)).unwrap();
    assert_eq!(host(&again).unwrap(), want.to_vec::<f32>().unwrap());

    // An explicit synchronize reports too, once.
    let idx1 = Layout::contiguous(&[3]);
    let bad_rows = CpuStorage::from_vec(vec![0i64, 12, 1]);
    let cpu_err = table.index_select(&tl, 0, (&bad_rows, &idx1)).unwrap_err();
    let _selected = tg
        .index_select(&tl, 0, (&gpu(dev, &bad_rows), &idx1))
        .unwrap();
    match synchronize(dev) {
        Err(
            e @ Error::DeferredCheck {
                op: "index_select",
                reported_at: "synchronize",
                ..
            },
        ) => {
            assert_eq!(e.kernel_error(), cpu_err.kernel_error());
            assert!(e.to_string().contains("KILN_CUDA_EAGER_CHECKS=1"), "{e}");
        }
        other => panic!("expected the deferred index_select error, got {other:?}"),
    }
    synchronize(dev).unwrap();

    // A put skips a bad index: scatter_add equals the CPU's with that element left out.
    let src = CpuStorage::from_vec((1..=6).map(|v| v as f32).collect::<Vec<f32>>());
    let sl = Layout::contiguous(&[2, 3]);
    let bad_scatter = CpuStorage::from_vec(vec![0i64, 4, 1, 3, 3, 2]);
    let summed = tg
        .scatter(
            &tl,
            1,
            (&gpu(dev, &bad_scatter), &il),
            (&gpu(dev, &src), &sl),
            true,
        )
        .unwrap();
    match host(&summed) {
        Err(Error::DeferredCheck {
            op: "scatter_add",
            error,
            ..
        }) => {
            let cpu = table.scatter(&tl, 1, (&bad_scatter, &il), (&src, &sl), true);
            assert_eq!(Some(&*error), cpu.unwrap_err().kernel_error());
        }
        other => panic!("expected the deferred scatter_add error, got {other:?}"),
    }
    let fixed_index = CpuStorage::from_vec(vec![0i64, 0, 1, 3, 3, 2]);
    let fixed_src = CpuStorage::from_vec(vec![1.0f32, 0.0, 3.0, 4.0, 5.0, 6.0]);
    let want = table
        .scatter(&tl, 1, (&fixed_index, &il), (&fixed_src, &sl), true)
        .unwrap();
    assert_eq!(host(&summed).unwrap(), want.to_vec::<f32>().unwrap());

    // Cross-entropy does not wait either: a bad target comes back at the next synchronisation
    // with the CPU's error inside, and its row's loss is NaN; its mean's denominator stays on
    // the device. An earlier op's pending bad index passes through cross-entropy unreported.
    let spec = CrossEntropySpec {
        shape: CrossEntropyShape {
            batch: 2,
            classes: 4,
            inner: 1,
        },
        target: TargetKind::Indices,
        ignore_index: -100,
        label_smoothing: 0.0,
        with_grad: true,
    };
    let logits_cpu = CpuStorage::from_vec((0..8).map(|v| v as f32 * 0.25).collect::<Vec<f32>>());
    let logits = gpu(dev, &logits_cpu);
    let (cl, tl2) = (Layout::contiguous(&[2, 4, 1]), Layout::contiguous(&[2, 1]));
    let targets = CpuStorage::from_vec(vec![3i64, 4]);
    let cpu_err = logits_cpu
        .softmax_cross_entropy(&cl, &targets, &tl2, None, &spec)
        .unwrap_err();
    let out = logits
        .softmax_cross_entropy(&cl, &gpu(dev, &targets), &tl2, None, &spec)
        .expect("a bad target is not reported at the op");
    match host(&out.losses) {
        Err(Error::DeferredCheck {
            op: "cross_entropy",
            error,
            ..
        }) => assert_eq!(Some(&*error), cpu_err.kernel_error()),
        other => panic!("expected cross_entropy's error at to_host, got {other:?}"),
    }
    let losses = host(&out.losses).unwrap();
    assert!(losses[0].is_finite() && losses[1].is_nan(), "{losses:?}");
    let _pending = tg.embedding(&tl, (&bg, &il)).unwrap();
    let good_targets = gpu(dev, &CpuStorage::from_vec(vec![3i64, 0]));
    let good = logits
        .softmax_cross_entropy(&cl, &good_targets, &tl2, None, &spec)
        .expect("cross_entropy does not wait, so it reports nothing");
    match host(&good.losses) {
        Err(Error::DeferredCheck {
            op: "embedding",
            reported_at,
            ..
        }) => assert_ne!(reported_at, "cross_entropy"),
        other => panic!("expected the embedding error at to_host, got {other:?}"),
    }
    let total = good.total_weight.to_host().unwrap().to_f64_vec();
    assert_eq!(total, vec![2.0]);

    // A bad index is reported to the thread that ran the op, not to another thread's copy.
    let (worker_ready, ready) = std::sync::mpsc::channel::<()>();
    let (go, worker_go) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let (table, bad, layouts) = (&tg, &bg, (&tl, &il));
        let worker = scope.spawn(move || {
            let out = table.embedding(layouts.0, (bad, layouts.1)).unwrap();
            worker_ready.send(()).unwrap();
            worker_go.recv().unwrap();
            host(&out)
        });
        ready.recv().unwrap();
        let good_rows = tg.embedding(&tl, (&gg, &il)).unwrap();
        assert_eq!(host(&good_rows).unwrap(), want_good);
        go.send(()).unwrap();
        match worker.join().unwrap() {
            Err(Error::DeferredCheck {
                op: "embedding",
                error,
                ..
            }) => assert_eq!(Some(&*error), embedding_err.kernel_error()),
            other => panic!("the worker expected its own embedding error, got {other:?}"),
        }
    });
}
