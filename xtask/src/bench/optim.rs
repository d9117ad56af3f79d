//! The `optim` benchmark group (issue 5): one fused AdamW step over the `clip` group's gradient
//! sets, against the memory-bandwidth limit measured in the same run (4 reads: parameter,
//! gradient, two moments; 3 writes: parameter, two moments), and the same step with the clip
//! coefficient handed to it (`step_with_grad_scale`) against clip-then-step. With `--vs-torch`,
//! the ResNet-18 set's two figures also get rows against PyTorch's `AdamW(fused=True)` step and
//! its `clip_grad_norm_` then that step, measured in the same run (`torch.rs`).

use super::clip::{bandwidth, grad_sets, params_with_grads, SHRINK};
use super::harness::{bandwidth_rows, median_secs, Options, Row};
use super::torch::{Figure, Pairs};
use kiln_optim::{AdamOptions, AdamW, Optimizer, ParamGroup};

const GROUP: &str = "optim";

/// The CPU cases of the group (`mod.rs` adds the CUDA ones of `optim_gpu.rs`).
pub(super) fn cpu_cases(options: &Options) -> Result<Vec<Row>, String> {
    let (read_bw, copy_bw) = bandwidth(options);
    let mut rows = Vec::from(bandwidth_rows(GROUP, read_bw, copy_bw));
    let reps = if options.quick { 1 } else { 5 };
    let e = |e: kiln_optim::Error| e.to_string();
    let mut pairs = Pairs::new(GROUP, options.vs_torch, options.quick);
    for set in grad_sets() {
        let params = params_with_grads(&set)?;
        let mut opt = AdamW::new(
            vec![ParamGroup::new(params.clone())],
            AdamOptions::adamw().lr(1e-4),
        )
        .map_err(e)?;
        let bytes = (set.numel() * 4) as f64;
        let t = median_secs(reps, || opt.step().map_err(e))?;
        // 4 reads + 3 writes: three read+write pairs at copy bandwidth plus one read.
        let limit = 6.0 * bytes / copy_bw + bytes / read_bw;
        rows.push(Row::new(
            GROUP,
            format!("{}: AdamW step, fused", set.name),
            "ms",
            t * 1e3,
            "bandwidth limit (4 reads + 3 writes)",
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
            pairs.add(&adamw, "adamw_resnet18", t * 1e3, Figure::Millis);
            pairs.add(
                &clip_adamw,
                "clip_adamw_resnet18",
                t_fused * 1e3,
                Figure::Millis,
            );
        }
    }
    rows.extend(pairs.into_rows());
    Ok(rows)
}
