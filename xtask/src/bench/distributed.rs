//! The `distributed` benchmark group (issue 19): DistributedDataParallel on the CPU over the
//! threads backend (`ThreadGroup`, two ranks as two threads of this process).
//!
//! Cases:
//! - `overlap`: an MLP 1024-2048-2048-2048-10 (42 MB of f32 gradients), batch 32 per rank
//!   (quick: 256-1024-1024-1024-10, 9.5 MB, batch 8), SGD, at PyTorch's default 25 MB buckets
//!   and at 4 MB buckets (quick: 1 MB). The figure is the
//!   fraction of the all-reduce time hidden behind backward: `1 - exposed / alone`, where
//!   `exposed` is the time `finish` waited for the all-reduces after backward (median over the
//!   steps) and `alone` the time the same buckets take to all-reduce with nothing else running
//!   (median); 1 means all communication was hidden.
//! - `scaling`: the same model's DDP step on 2 ranks (batch B each) against one process over
//!   the same 2B samples on the same cores (kiln's one CPU pool serves both ranks, so this is
//!   the share of the step that is not distributed overhead); the ratio is against the 90 %
//!   target. A second row times the same step on 2 MPI processes (`mpirun -np 2` of this
//!   xtask, [`super::distributed_mpi`]), the usual scaling efficiency of a CPU deployment;
//!   without an `mpi` build of xtask or without `mpirun` that row has no value and says which.
//! - `resnet50 timeline`: one ResNet-50 backward (224x224, batch 1) with DDP's
//!   default buckets on one rank (quick: 64x64): when each bucket's gradients are complete, as a fraction of
//!   backward (printed), and the share of backward left after the first bucket is ready (the
//!   window that can hide communication). The shape docs/DISTRIBUTED.md models GPUs with.

use super::distributed_parts::{median, model, sgd};
use super::harness::{err, Options, Row};
use kiln_autograd::{DType, Device, Module, Tensor};
use kiln_distributed::{DdpOptions, DistributedDataParallel, ProcessGroup, ReduceOp, ThreadGroup};
use kiln_losses::{mse_loss, Reduction};
use kiln_models::models::resnet50;
use kiln_models::Layer;
use kiln_optim::Optimizer;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GROUP: &str = "distributed";
const CPU: Device = Device::Cpu;
const SIZES: [usize; 5] = [1024, 2048, 2048, 2048, 10];
const QUICK_SIZES: [usize; 5] = [256, 1024, 1024, 1024, 10];
const TIMEOUT: Duration = Duration::from_secs(600);

/// Runs every case of the group.
pub fn run(options: &Options) -> Result<Vec<Row>, String> {
    if options.gpu_only {
        return Ok(Vec::new()); // NCCL cases come with the NCCL backend
    }
    let (sizes, batch, steps, small_cap) = if options.quick {
        (QUICK_SIZES, 8, 2, 1.0)
    } else {
        (SIZES, 32, 5, 4.0)
    };
    let grad_mb = {
        let m = model(&sizes)?;
        m.parameters().iter().map(|p| p.numel()).sum::<usize>() as f64 * 4.0 / 1e6
    };
    let mut rows = Vec::new();
    let single = single_step_seconds(&sizes, 2 * batch, steps)?;
    for cap in [25.0, small_cap] {
        let m = ddp_steps(&sizes, batch, steps, cap)?;
        let overlap = (1.0 - m.exposed / m.alone).clamp(0.0, 1.0);
        eprintln!(
            "bench distributed: {cap} MB buckets: {} buckets, step {:.1} ms, backward {:.1} ms, \
             all-reduce alone {:.1} ms, exposed {:.1} ms",
            m.buckets,
            m.step * 1e3,
            m.backward * 1e3,
            m.alone * 1e3,
            m.exposed * 1e3
        );
        rows.push(Row::new(
            GROUP,
            format!("overlap: 2 ranks (threads), mlp {grad_mb:.1} MB grads, {cap} MB buckets ({} buckets), batch {batch}/rank", m.buckets),
            "fraction of all-reduce hidden",
            overlap,
            format!("all-reduce alone {:.1} ms, exposed after backward {:.1} ms", m.alone * 1e3, m.exposed * 1e3),
            overlap,
        ));
        if cap == 25.0 {
            let efficiency = single / m.step;
            rows.push(Row::new(
                GROUP,
                format!("scaling: 2 ranks (threads) x batch {batch} vs 1 process x batch {}, same cores", 2 * batch),
                "efficiency",
                efficiency,
                format!("1 process {:.1} ms/step, DDP {:.1} ms/step; target 0.9", single * 1e3, m.step * 1e3),
                efficiency / 0.9,
            ));
            rows.push(super::distributed_mpi::scaling_row(
                GROUP,
                (&sizes, batch, steps),
                single,
            ));
        }
    }
    rows.push(resnet50_timeline(options)?);
    Ok(rows)
}

fn step(model: &dyn Layer, x: &Tensor, opt: &mut dyn Optimizer) -> Result<(), String> {
    let out = model.forward(x).map_err(err)?;
    let loss = mse_loss(&out, &out.zeros_like().map_err(err)?, Reduction::Mean).map_err(err)?;
    loss.backward().map_err(err)?;
    opt.step().map_err(err)?;
    opt.zero_grad(true).map_err(err)
}

/// Median seconds of one single-process step over `batch` samples (after a warm-up step).
fn single_step_seconds(sizes: &[usize], batch: usize, steps: usize) -> Result<f64, String> {
    let m = model(sizes)?;
    let mut opt = sgd(&m)?;
    let x = Tensor::randn(&[batch, sizes[0]], DType::F32, CPU).map_err(err)?;
    step(&m, &x, opt.as_mut())?;
    let mut t = Vec::new();
    for _ in 0..steps {
        let start = Instant::now();
        step(&m, &x, opt.as_mut())?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(median(t))
}

struct DdpFigures {
    buckets: usize,
    step: f64,
    backward: f64,
    exposed: f64,
    alone: f64,
}

/// Rank 0's medians over `steps` DDP steps on 2 ranks, and the buckets' all-reduce time alone.
fn ddp_steps(
    sizes: &[usize],
    batch: usize,
    steps: usize,
    cap_mb: f64,
) -> Result<DdpFigures, String> {
    let per_rank = ThreadGroup::run(2, TIMEOUT, |g| -> Result<DdpFigures, String> {
        let group: Arc<dyn ProcessGroup> = Arc::new(g);
        let options = DdpOptions::default().bucket_cap_mb(cap_mb);
        let ddp =
            DistributedDataParallel::new(model(sizes)?, group.clone(), options).map_err(err)?;
        let mut opt = sgd(ddp.module())?;
        let x = Tensor::randn(&[batch, sizes[0]], DType::F32, CPU).map_err(err)?;
        let (mut step_t, mut bwd_t, mut exposed) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..=steps {
            let start = Instant::now();
            let out = ddp.forward(&x).map_err(err)?;
            let zeros = out.zeros_like().map_err(err)?;
            let loss = mse_loss(&out, &zeros, Reduction::Mean).map_err(err)?;
            let bwd = Instant::now();
            loss.backward().map_err(err)?;
            let bwd = bwd.elapsed().as_secs_f64();
            ddp.finish().map_err(err)?;
            opt.step().map_err(err)?;
            opt.zero_grad(true).map_err(err)?;
            if i > 0 {
                step_t.push(start.elapsed().as_secs_f64());
                bwd_t.push(bwd);
                exposed.push(ddp.last_stats().exposed_wait.as_secs_f64());
            }
        }
        // The same buckets all-reduced with nothing else running.
        let buckets = ddp.buckets();
        let flats: Vec<Tensor> = buckets
            .iter()
            .map(|b| Tensor::zeros(&[b.numel], b.dtype, CPU))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let mut alone = Vec::new();
        for _ in 0..steps {
            group.barrier().map_err(err)?;
            let start = Instant::now();
            let works = flats
                .iter()
                .map(|f| group.start_all_reduce(f, ReduceOp::Avg))
                .collect::<Result<Vec<_>, _>>()
                .map_err(err)?;
            for w in works {
                w.wait().map_err(err)?;
            }
            alone.push(start.elapsed().as_secs_f64());
        }
        Ok(DdpFigures {
            buckets: buckets.len(),
            step: median(step_t),
            backward: median(bwd_t),
            exposed: median(exposed),
            alone: median(alone),
        })
    })
    .map_err(err)?;
    per_rank.into_iter().next().ok_or("no rank ran")?
}

/// One ResNet-50 backward with DDP's default buckets on one rank: the bucket-ready timeline.
fn resnet50_timeline(options: &Options) -> Result<Row, String> {
    let side = if options.quick { 64 } else { 224 };
    let rows = ThreadGroup::run(1, TIMEOUT, |g| -> Result<Row, String> {
        let group: Arc<dyn ProcessGroup> = Arc::new(g);
        let model = resnet50(1000).map_err(err)?;
        let ddp = DistributedDataParallel::new(model, group, DdpOptions::default()).map_err(err)?;
        let x = Tensor::randn(&[1, 3, side, side], DType::F32, CPU).map_err(err)?;
        let mut last = None;
        for _ in 0..2 {
            let out = ddp.forward(&x).map_err(err)?;
            let loss = out.square().map_err(err)?.mean_all().map_err(err)?;
            let start = Instant::now();
            loss.backward().map_err(err)?;
            let backward = start.elapsed().as_secs_f64();
            ddp.finish().map_err(err)?;
            ddp.module().zero_grad(true).map_err(err)?;
            last = Some((start, backward, ddp.last_stats()));
        }
        let (start, backward, stats) = last.ok_or("no step ran")?;
        let buckets = ddp.buckets();
        let fractions: Vec<f64> = stats
            .bucket_started_at
            .iter()
            .map(|t| t.duration_since(start).as_secs_f64() / backward)
            .collect();
        for (b, (bucket, f)) in buckets.iter().zip(&fractions).enumerate() {
            eprintln!(
                "bench distributed: resnet50 {side}x{side}: bucket {b}: {:.2} MB, {} params, \
                 ready at {:.3} of backward ({backward:.3} s)",
                bucket.bytes() as f64 / 1e6,
                bucket.params.len(),
                f
            );
        }
        let window = 1.0 - fractions.first().copied().unwrap_or(1.0);
        Ok(Row::new(
            GROUP,
            format!(
                "resnet50 timeline: {side}x{side} batch 1, {} buckets of 25 MB",
                buckets.len()
            ),
            "share of backward after the first bucket is ready",
            window,
            format!(
                "backward {:.3} s on this CPU; buckets ready at {fractions:.3?} of it",
                backward
            ),
            window,
        ))
    })
    .map_err(err)?;
    rows.into_iter().next().ok_or("no rank ran")?
}
