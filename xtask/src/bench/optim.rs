//! The `optim` benchmark group (issue 5): one fused AdamW step over the `clip` group's gradient
//! sets, against the memory-bandwidth limit measured in the same run (4 reads: parameter,
//! gradient, two moments; 3 writes: parameter, two moments; measured as a pass of that shape,
//! since on this kind of machine a read-only pass and a copy pass both understate it: reads
//! alone leave write bandwidth unused, and a copy's destination is read before it is written),
//! and the same step with the clip
//! coefficient handed to it (`step_with_grad_scale`) against clip-then-step. With `--vs-torch`,
//! the ResNet-18 set's two figures also get rows against PyTorch's `AdamW(fused=True)` step and
//! its `clip_grad_norm_` then that step, and the 2,000-tensor set's step a row against PyTorch's
//! fused step (the per-parameter cost), measured in the same run (`torch.rs`).

use super::clip::{grad_sets, params_with_grads, SHRINK};
use super::harness::{host_array, median_secs, Options, Row};
use super::torch::{Figure, Pairs};
use kiln_device::threads::cpu_pool;
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup};
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

const GROUP: &str = "optim";

/// Bandwidth in bytes/s of a pass with AdamW's traffic: three arrays updated in place and a
/// fourth read (4 reads + 3 writes per element, counted as such), on arrays well past the
/// last-level cache and in the allocator's memory as tensors are ([`host_array`]), split over
/// kiln's pool as the optimizer's step is; the best of a few runs.
fn adam_traffic_bandwidth(options: &Options) -> Result<f64, String> {
    let n = if options.quick { 4 << 20 } else { 16 << 20 };
    let array = |scale: f32| host_array(n, |i| (i % 97) as f32 * scale);
    let (mut p, g, mut m, mut v) = (array(1e-3)?, array(2e-3)?, array(0.0)?, array(0.0)?);
    const CHUNK: usize = 1 << 16;
    let reps = if options.quick { 2 } else { 7 };
    let mut best = f64::MAX;
    cpu_pool().install(|| {
        for _ in 0..reps {
            let t = Instant::now();
            p.par_chunks_mut(CHUNK)
                .zip(g.par_chunks(CHUNK))
                .zip(m.par_chunks_mut(CHUNK))
                .zip(v.par_chunks_mut(CHUNK))
                .for_each(|(((p, g), m), v)| {
                    let lanes = p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut());
                    // Each value read once and stored once: a load after a store to another
                    // array (blocks share their address bits below 4 KiB) waits on it.
                    for (((p, &g), m), v) in lanes {
                        let (mn, vn) = (*m * 0.9 + g, *v * 0.999 + g * g);
                        let pn = *p * 0.9999 - mn * 1e-4;
                        (*m, *v, *p) = (mn, vn, pn);
                    }
                });
            black_box((&p, &m, &v));
            best = best.min(t.elapsed().as_secs_f64());
        }
    });
    Ok((7 * n * 4) as f64 / best)
}

/// The CPU cases of the group (`mod.rs` adds the CUDA ones of `optim_gpu.rs`).
pub(super) fn cpu_cases(options: &Options) -> Result<Vec<Row>, String> {
    // Only the pass with AdamW's own traffic is a limit for these rows (the read and copy
    // passes that bound the clip group understate it, see the top of this file).
    let adam_bw = adam_traffic_bandwidth(options)?;
    let mut rows = vec![Row::new(
        GROUP,
        "memory bandwidth: 4 reads + 3 writes pass (AdamW's traffic)",
        "GB/s",
        adam_bw / 1e9,
        "measured this run",
        1.0,
    )];
    let reps = if options.quick { 1 } else { 5 };
    let e = |e: kiln_optim::Error| e.to_string();
    let mut pairs = Pairs::new(GROUP, options);
    for set in grad_sets() {
        let params = params_with_grads(&set)?;
        let mut opt = AdamW::new(
            vec![ParamGroup::new(params.clone())],
            AdamOptions::adamw().lr(1e-4),
        )
        .map_err(e)?;
        let bytes = (set.numel() * 4) as f64;
        let t = median_secs(reps, || opt.step().map_err(e))?;
        // 4 reads + 3 writes per element, at the bandwidth of a pass with that traffic.
        let limit = 7.0 * bytes / adam_bw;
        rows.push(Row::new(
            GROUP,
            format!("{}: AdamW step, fused", set.name),
            "ms",
            t * 1e3,
            format!(
                "memory limit {:.3} ms (4 reads + 3 writes at {:.1} GB/s)",
                limit * 1e3,
                adam_bw / 1e9
            ),
            limit / t,
        ));
        // Both variants really clip (max_norm = 0.99 x the current total): separately, the
        // gradients are scaled in place each run; handed over, they are not.
        let mut total = kiln_optim::clip_coef_for(&params, 1.0, 2.0, false)
            .map_err(e)?
            .total_norm;
        let t_sep = median_secs(reps, || {
            total = kiln_optim::clip_grad_norm_(&params, total * SHRINK, 2.0, false).map_err(e)?
                * SHRINK;
            opt.step().map_err(e)
        })?;
        let t_fused = median_secs(reps, || {
            let info = kiln_optim::clip_coef_for(&params, total * SHRINK, 2.0, false).map_err(e)?;
            opt.step_with_grad_scale(info.coef).map_err(e)
        })?;
        rows.push(Row::new(
            GROUP,
            format!("{}: clip coef handed to AdamW step", set.name),
            "ms",
            t_fused * 1e3,
            "clip_grad_norm_ then step, same run",
            t_sep / t_fused,
        ));
        if set.name.starts_with("resnet18") {
            let case = |what| format!("resnet18 (62 tensors): {what}");
            let (adamw, clip_adamw) = (case("AdamW step, fused"), case("clip + AdamW step"));
            pairs.add(&adamw, "adamw_resnet18", Figure::Millis, t * 1e3, || {
                Ok(median_secs(reps, || opt.step().map_err(e))? * 1e3)
            })?;
            let mut coef_into_step = || {
                let info =
                    kiln_optim::clip_coef_for(&params, total * SHRINK, 2.0, false).map_err(e)?;
                opt.step_with_grad_scale(info.coef).map_err(e)
            };
            let fused_ms = t_fused * 1e3;
            pairs.add(
                &clip_adamw,
                "clip_adamw_resnet18",
                Figure::Millis,
                fused_ms,
                || Ok(median_secs(reps, &mut coef_into_step)? * 1e3),
            )?;
        } else if set.name.starts_with("2000") {
            // Thousands of small tensors: the per-parameter bookkeeping of a step, against
            // PyTorch's fused step over the same list.
            let adamw = "2000 x 1000: AdamW step, fused";
            pairs.add(adamw, "adamw_2000x1000", Figure::Millis, t * 1e3, || {
                Ok(median_secs(reps, || opt.step().map_err(e))? * 1e3)
            })?;
        }
    }
    rows.extend(pairs.into_rows());
    Ok(rows)
}
