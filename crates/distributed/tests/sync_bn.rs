//! SyncBatchNorm: DDP training with batch statistics over every rank equals one process with
//! BatchNorm2d over the concatenated batch (parameters and running statistics).

mod common;

use common::*;
use kiln_autograd::Module;
use kiln_distributed::{
    convert_sync_batchnorm, DdpOptions, DistributedDataParallel, ProcessGroup, SyncBatchNorm,
    ThreadGroup,
};
use kiln_models::layers::{Conv2d, Conv2dConfig, Flatten, Linear, ReLU, Sequential};
use kiln_models::Layer;
use std::sync::Arc;
use std::time::Duration;

const STEPS: usize = 4;
const B: usize = 3;

fn conv_sync_bn(group: &Arc<dyn ProcessGroup>) -> Sequential {
    let cfg = Conv2dConfig {
        padding: [1, 1],
        ..Default::default()
    };
    Sequential::new()
        .push(Conv2d::new(2, 4, 3, cfg).unwrap())
        .push(SyncBatchNorm::new(4, group.clone()).unwrap())
        .push(ReLU::new())
        .push(Flatten::new())
        .push(Linear::new(64, 3, true).unwrap())
}

#[test]
fn sync_batchnorm_training_equals_batchnorm_over_the_concatenated_batch() {
    for world in [2, 3] {
        let want = {
            let model = conv_bn();
            init(&model, 0.0);
            let mut o = optimizer(&model, Opt::SgdMomentum);
            for step in 0..STEPS {
                let (x, y) = batch(step, world * B, &[2, 4, 4]);
                loss(&model.forward(&x).unwrap(), &y).backward().unwrap();
                o.step().unwrap();
                o.zero_grad(true).unwrap();
            }
            state(&model)
        };
        // Built with SyncBatchNorm layers on even ranks and converted in place from
        // BatchNorm2d (`convert_sync_batchnorm`, one layer) on odd ones: the same layer.
        let got = ThreadGroup::run(world, Duration::from_secs(60), |g| {
            let rank = g.rank();
            let group: Arc<dyn ProcessGroup> = Arc::new(g);
            let model = if rank % 2 == 0 {
                conv_sync_bn(&group)
            } else {
                let mut model = conv_bn();
                assert_eq!(convert_sync_batchnorm(&mut model, group.clone()), 1);
                model
            };
            init(&model, rank as f64);
            let ddp = DistributedDataParallel::new(model, group, DdpOptions::default()).unwrap();
            let mut o = optimizer(ddp.module(), Opt::SgdMomentum);
            for step in 0..STEPS {
                let (x, y) = batch(step, world * B, &[2, 4, 4]);
                let out = ddp.forward(&rows(&x, rank, B)).unwrap();
                ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap();
                o.step().unwrap();
                o.zero_grad(true).unwrap();
            }
            state(ddp.module())
        })
        .unwrap();
        for (r, s) in got.iter().enumerate() {
            assert_eq!(s, &got[0], "world {world}: rank {r} differs from rank 0");
        }
        let (worst, at) = max_rel_diff(&got[0], &want);
        println!("sync bn world {world}: worst relative difference {worst:.2e} at {at}");
        // E[x^2] - E[x]^2 in f32 against the single process's fused kernel, and per-rank sums
        // against one sum: a few f32 ulps (measured below 1e-7), carried through the steps.
        assert!(worst < 1e-6, "world {world}: {worst} at {at}");
        let mut start = conv_bn();
        start.eval();
        init(&start, 0.0);
        assert!(
            max_rel_diff(&got[0], &state(&start)).0 > 1e-3,
            "training moved"
        );
    }
}
