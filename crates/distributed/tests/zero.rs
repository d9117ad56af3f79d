//! ZeRO-1: the sharded optimizer equals the unsharded one bit for bit, each rank holds only its
//! shard's state, and the memory plan's saving.

mod common;

use common::*;
use kiln_autograd::{DType, Module};
use kiln_distributed::zero::{optimizer_state_bytes, partition, zero1_saving};
use kiln_distributed::{
    DdpOptions, DistributedDataParallel, ProcessGroup, ThreadGroup, ZeroRedundancyOptimizer,
};
use kiln_models::OptimizerKind;
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup};
use std::sync::Arc;
use std::time::Duration;

const STEPS: usize = 4;
const B: usize = 3;

#[test]
fn the_partition_balances_elements_greedily_and_deterministically() {
    // The MLP's sizes 64, 16, 128, 8, 24, 3: 128 goes to rank 0, 64 to rank 1, and rank 1 stays
    // the lighter one (64 + 24 + 16 + 8 + 3 = 115 < 128), so it takes the rest.
    assert_eq!(
        partition(&[64, 16, 128, 8, 24, 3], 2),
        vec![1, 1, 0, 1, 1, 1]
    );
    assert_eq!(
        partition(&[64, 16, 128, 8, 24, 3], 3),
        vec![1, 2, 0, 2, 2, 2]
    );
    assert_eq!(partition(&[5, 5, 5, 5], 4), vec![0, 1, 2, 3]);
    assert_eq!(partition(&[], 3), Vec::<usize>::new());
}

fn adamw(p: Vec<(String, kiln_autograd::Parameter)>) -> kiln_optim::Result<Box<dyn Optimizer>> {
    Ok(Box::new(AdamW::new(
        vec![ParamGroup::new(p)],
        AdamOptions::adamw().lr(0.01),
    )?))
}

/// DDP training on `world` ranks, sharded (ZeRO-1) or not: final state and state bytes per rank.
/// Per rank: the final state, the optimizer state bytes, the owned parameter names.
type RankResult = (Vec<(String, Vec<f64>)>, usize, Vec<String>);

fn run(world: usize, sharded: bool) -> Vec<RankResult> {
    ThreadGroup::run(world, Duration::from_secs(60), |g| {
        let rank = g.rank();
        let model = mlp();
        init(&model, rank as f64);
        let group: Arc<dyn ProcessGroup> = Arc::new(g);
        let ddp =
            DistributedDataParallel::new(model, group.clone(), DdpOptions::default()).unwrap();
        let params = ddp.module().named_parameters();
        let mut zero = sharded
            .then(|| ZeroRedundancyOptimizer::new(params.clone(), group.clone(), adamw).unwrap());
        let mut plain = (!sharded).then(|| adamw(params.clone()).unwrap());
        for step in 0..STEPS {
            let (x, y) = batch(step, world * B, &[4]);
            let out = ddp.forward(&rows(&x, rank, B)).unwrap();
            ddp.backward(&loss(&out, &rows(&y, rank, B))).unwrap();
            // Odd steps drop the gradients, even ones zero them in place (as kept buffers).
            let set_to_none = step % 2 == 1;
            if let Some(z) = zero.as_mut() {
                z.step().unwrap();
                z.zero_grad(set_to_none).unwrap();
            }
            if let Some(o) = plain.as_mut() {
                o.step().unwrap();
                o.zero_grad(set_to_none).unwrap();
            }
        }
        let (bytes, owned) = match (&zero, &plain) {
            (Some(z), _) => (z.state_bytes().unwrap(), z.owned_names()),
            (None, Some(o)) => (optimizer_state_bytes(o.as_ref()).unwrap(), Vec::new()),
            _ => unreachable!(),
        };
        (state(ddp.module()), bytes, owned)
    })
    .unwrap()
}

#[test]
fn sharded_adamw_equals_the_unsharded_run_and_holds_a_shard_of_the_state() {
    for world in [2, 3] {
        let plain = run(world, false);
        let sharded = run(world, true);
        let unsharded_bytes = plain[0].1;
        // AdamW keeps exp_avg and exp_avg_sq (f32) for each of the MLP's 243 elements.
        assert_eq!(unsharded_bytes, 2 * 4 * 243);
        let mut total = 0;
        let mut owned_all = Vec::new();
        for (rank, (s, bytes, owned)) in sharded.iter().enumerate() {
            assert_eq!(
                s, &plain[0].0,
                "world {world}: rank {rank} differs from the unsharded run"
            );
            assert!(
                *bytes < unsharded_bytes,
                "world {world} rank {rank}: {bytes}"
            );
            println!("world {world} rank {rank}: {bytes} of {unsharded_bytes} state bytes, owns {owned:?}");
            total += bytes;
            owned_all.extend(owned.clone());
        }
        assert_eq!(
            total, unsharded_bytes,
            "the shards add up to the whole state"
        );
        owned_all.sort();
        let mut names: Vec<String> = plain[0].0.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        assert_eq!(owned_all, names, "every parameter has exactly one owner");
    }
}

#[test]
fn the_memory_plan_shows_the_saving() {
    let model = mlp();
    let p = kiln_models::plan(&model, &[4], DType::F32, OptimizerKind::AdamW).unwrap();
    let numels: Vec<usize> = model.parameters().iter().map(|p| p.numel()).collect();
    let one = zero1_saving(&p, &numels, 1);
    assert_eq!(one.sharded_state_bytes, p.optimizer_state_bytes);
    assert_eq!(one.fixed_bytes, p.fixed_bytes());
    let two = zero1_saving(&p, &numels, 2);
    // The larger shard owns 128 of 243 elements (see the partition test).
    assert_eq!(
        two.sharded_state_bytes,
        (p.optimizer_state_bytes as f64 * 128.0 / 243.0).ceil() as usize
    );
    assert_eq!(
        two.fixed_bytes,
        p.fixed_bytes() - p.optimizer_state_bytes + two.sharded_state_bytes
    );
}

/// The state of an AdamW step over a parameter of each dtype kiln's optimizers update:
/// `exp_avg` and `exp_avg_sq` in the parameter's dtype, counted at that dtype's size.
#[test]
fn state_bytes_count_each_dtype_at_its_size() {
    for (dtype, size) in [(DType::F32, 4), (DType::F64, 8)] {
        let ones = || kiln_autograd::Tensor::ones(&[10], dtype, kiln_autograd::Device::Cpu);
        let p = kiln_autograd::Parameter::new(ones().unwrap()).unwrap();
        p.set_grad(Some(ones().unwrap())).unwrap();
        let mut o = adamw(vec![("w".into(), p)]).unwrap();
        o.step().unwrap();
        let bytes = optimizer_state_bytes(o.as_ref()).unwrap();
        assert_eq!(bytes, 2 * 10 * size, "{dtype}");
    }
}
